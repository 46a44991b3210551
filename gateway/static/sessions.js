// The sessions table: filters by agent, type and status; pages by the API's cursor; live refresh.

import { get, live } from "./api.js";
import { badge, bar, empty, h, hashHref, num, replace, sessionHref, spinner, time, when } from "./dom.js";
import { showError } from "./ui.js";

const TYPES = ["direct", "group", "channel", "cron", "hook"];
const STATUSES = ["running", "paused", "idle"];
const COLUMNS = ["Key", "Agent", "Type", "Status", "Last activity", "Tokens / threshold", "Compactions", "Next reset"];

function select(name, label, options, value) {
  return h("label", { class: "field" }, h("span", {}, label),
    h("select", { name }, h("option", { value: "" }, "any"),
      options.map((o) => h("option", { value: o, selected: o === value }, o))));
}

function row(s) {
  const tokens = s.tokens || {};
  const cell = (label, ...content) => h("td", { dataset: { label } }, ...content);
  return h("tr", { dataset: { key: s.key } },
    cell("Key", h("a", { href: sessionHref(s.key), class: "key-link mono" }, s.key),
      s.label ? h("div", { class: "muted small" }, s.label) : null,
      s.pinned ? badge("pinned", "badge-pin") : null),
    cell("Agent", s.agent_id || "–"),
    cell("Type", s.chat_type),
    cell("Status", badge(s.status)),
    cell("Last activity", time(s.last_interaction_at || s.created_at)),
    cell("Tokens", bar(tokens.context || 0, tokens.threshold || s.threshold || 0)),
    cell("Compactions", num(s.compactions)),
    cell("Next reset", s.next_reset ? h("span", { title: s.next_reset }, when(s.next_reset)) : "–"));
}

export function mountSessions(root, query) {
  const filters = { agent: query.get("agent") || "", type: query.get("type") || "", status: query.get("status") || "" };
  const limit = Number(query.get("limit")) || 50;
  const cursors = [null]; // cursors[i] opens page i
  let pageIndex = 0;
  let nextCursor = null;

  const form = h("form", { class: "filters", role: "search" },
    h("label", { class: "field" }, h("span", {}, "Agent"),
      h("input", { name: "agent", type: "text", value: filters.agent, placeholder: "any", size: 10 })),
    select("type", "Type", TYPES, filters.type),
    select("status", "Status", STATUSES, filters.status),
    h("div", { class: "filter-actions" },
      h("button", { type: "submit", class: "btn btn-primary" }, "Filter"),
      h("a", { class: "btn", href: "#/sessions" }, "Clear")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    location.hash = hashHref("/sessions", Object.fromEntries(data.entries()));
  });

  const count = h("span", { class: "muted" });
  const body = h("div", { class: "table-wrap" }, spinner());
  const prev = h("button", { type: "button", class: "btn", disabled: true }, "← Newer");
  const next = h("button", { type: "button", class: "btn", disabled: true }, "Older →");
  const pageLabel = h("span", { class: "muted" });
  prev.addEventListener("click", () => { pageIndex -= 1; load(); });
  next.addEventListener("click", () => { pageIndex += 1; cursors[pageIndex] = nextCursor; load(); });

  replace(root,
    h("div", { class: "view-head" }, h("h1", {}, "Sessions"), count),
    form, body,
    h("nav", { class: "pager", "aria-label": "Pages" }, prev, pageLabel, next));

  let loading = null;
  async function load() {
    const mine = (loading = {});
    try {
      const data = await get("/v1/sessions", { ...filters, limit, cursor: cursors[pageIndex] });
      if (mine !== loading) return;
      nextCursor = data.next_cursor;
      prev.disabled = pageIndex === 0;
      next.disabled = !nextCursor;
      pageLabel.textContent = `page ${pageIndex + 1}`;
      const n = data.sessions.length;
      count.textContent = `${n} session${n === 1 ? "" : "s"}${nextCursor || pageIndex ? " on this page" : ""}`;
      if (!data.sessions.length) {
        replace(body, empty(pageIndex || Object.values(filters).some(Boolean)
          ? "No sessions match these filters." : "No sessions yet: post a message to a key and it appears here."));
        return;
      }
      replace(body, h("table", { class: "table sessions-table" },
        h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, data.sessions.map(row))));
    } catch (error) {
      showError(error);
      replace(body, empty("Could not load the sessions."));
    }
  }

  let timer = null;
  const unsubscribe = live.subscribe((event) => {
    if (!event.key || timer) return;
    timer = setTimeout(() => { timer = null; load(); }, 700);
  });
  load();
  return () => { unsubscribe(); clearTimeout(timer); };
}
