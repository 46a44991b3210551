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
  // each cell carries its column's name: at phone width the header row is hidden and CSS shows it
  const [channel, name, agent, status, bot, mode, update, into, out, error] = COLUMNS;
  const cell = (label, attrs, content) => h("td", { ...attrs, dataset: { label } }, content);
  return h("tr", { "data-account": `${account.channel}:${account.account}` },
    cell(channel, {}, account.channel),
    cell(name, { class: "mono" }, account.account),
    cell(agent, {}, account.agent),
    cell(status, {}, state(account)),
    cell(bot, { class: "mono" }, account.username ? `@${account.username}` : "—"),
    cell(mode, {}, account.mode),
    cell(update, {}, account.last_update_at ? time(account.last_update_at) : "—"),
    cell(into, { class: "num" }, String(account.messages_in)),
    cell(out, { class: "num" }, String(account.messages_out)),
    cell(error, { class: account.last_error ? "error-text" : "" }, account.last_error || "—"));
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
        replace(body, empty("No chat channel accounts configured (channels.<platform>.accounts in the config: telegram, slack, discord)."));
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
