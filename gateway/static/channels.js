// Chat channel accounts (GET /v1/channels): connected, bot, last update, messages in/out, last error.

import { get } from "./api.js";
import { badge, empty, h, replace, spinner, time } from "./dom.js";

const COLUMNS = ["Channel", "Account", "Agent", "State", "Bot", "Mode", "Last update", "In", "Out", "Last error"];
const REFRESH_MS = 5000;

function state(account) {
  if (!account.enabled) return badge("disabled", "badge-idle");
  return account.connected ? badge("connected", "badge-running") : badge("not connected", "badge-failed");
}

function row(account) {
  return h("tr", { "data-account": `${account.channel}:${account.account}` },
    h("td", {}, account.channel),
    h("td", { class: "mono" }, account.account),
    h("td", {}, account.agent),
    h("td", {}, state(account)),
    h("td", { class: "mono" }, account.username ? `@${account.username}` : "—"),
    h("td", {}, account.mode),
    h("td", {}, account.last_update_at ? time(account.last_update_at) : "—"),
    h("td", { class: "num" }, String(account.messages_in)),
    h("td", { class: "num" }, String(account.messages_out)),
    h("td", { class: account.last_error ? "error-text" : "" }, account.last_error || "—"));
}

export function mountChannels(root) {
  const body = h("div", {}, spinner());
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Channels")), body);
  let stopped = false;
  async function load() {
    try {
      const data = await get("/v1/channels");
      if (stopped) return;
      if (!data.accounts.length) {
        replace(body, empty("No chat channel accounts configured (channels.telegram.accounts in the config)."));
        return;
      }
      replace(body, h("table", { class: "table channels-table" },
        h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, data.accounts.map(row))));
    } catch (error) {
      if (!stopped) replace(body, empty(`Could not load the channels: ${error.message}`));
    }
  }
  load();
  const timer = setInterval(load, REFRESH_MS);
  return () => { stopped = true; clearInterval(timer); };
}
