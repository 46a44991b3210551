// A run's transcript (messages.jsonl, paginated by seq) with compaction markers, tool calls and
// results; and the renderers for context lines, tool records and plans.

import { get, runPath } from "./api.js";
import { badge, empty, h, num, pretty, replace, runHref, shortId, time, when } from "./dom.js";
import { showError } from "./ui.js";

const PAGE = 200;

function roleLabel(m) {
  if (m.role === "user") return m.name ? `user · ${m.name}` : "user";
  if (m.role === "tool") return m.tool_name ? `tool · ${m.tool_name}` : "tool";
  return m.role;
}

function head(m, extra) {
  return h("header", { class: "msg-head" },
    h("span", { class: "msg-role" }, roleLabel(m)),
    extra,
    m.seq ? h("span", { class: "msg-seq" }, `#${m.seq}`) : null,
    m.timestamp ? time(m.timestamp) : null);
}

function toolCall(call) {
  const fn = call.function || {};
  return h("div", { class: "toolcall" },
    h("div", { class: "toolcall-head" }, h("span", { class: "toolcall-arrow" }, "→ "),
      h("code", {}, fn.name || "tool"), call.id ? h("span", { class: "muted" }, ` ${call.id}`) : null),
    h("pre", { class: "code" }, pretty(fn.arguments ?? "")));
}

/** A summary or an inherited summary, shown as a card. */
export function summaryCard(m) {
  const inherited = m.kind === "inheritance";
  const title = inherited ? "Inherited summary"
    : `Summary of messages ${m.covers_from ?? "?"}–${m.end_seq ?? "?"}`;
  return h("article", { class: `summary-card ${inherited ? "summary-inherited" : ""}`, dataset: { kind: m.kind } },
    h("header", {}, h("strong", {}, title), m.tokens ? h("span", { class: "muted" }, `${num(m.tokens)} tokens`) : null),
    h("div", { class: "msg-body" }, m.content || ""));
}

export function renderMessage(m) {
  if (m.kind === "summary" || m.kind === "inheritance") {
    return h("li", { class: "msg msg-card", dataset: { seq: m.seq ?? "" } }, summaryCard(m));
  }
  const classes = ["msg", `msg-${m.role}`];
  if (m.command) classes.push("msg-command");
  if (m.kind) classes.push(`msg-kind-${m.kind}`);
  const item = h("li", { class: classes.join(" "), dataset: { seq: m.seq ?? "", role: m.role } });
  if (m.kind === "recall") {
    item.append(h("details", {}, h("summary", {}, head(m, badge("memory recall", "badge-muted"))),
      h("div", { class: "msg-body" }, m.content || "")));
    return item;
  }
  if (m.role === "tool") {
    const text = pretty(m.content || "");
    item.append(h("details", {},
      h("summary", {}, head(m, m.tool_call_id ? h("span", { class: "muted" }, `result of ${m.tool_call_id}`) : null)),
      h("pre", { class: "code" }, text)));
    return item;
  }
  item.append(head(m, m.command ? badge("command", "badge-muted") : null));
  if (m.content) item.append(h("div", { class: "msg-body" }, m.content));
  for (const call of m.tool_calls || []) item.append(toolCall(call));
  return item;
}

function markerFor(record, reverted) {
  const parts = [
    `messages ${record.start_seq}–${record.end_seq}`,
    `${num(record.tokens_before)} → ${num(record.tokens_after)} tokens`,
    record.summarizer, record.trigger,
  ].filter(Boolean);
  return h("li", { class: `marker ${reverted ? "marker-reverted" : ""}`, role: "separator",
    dataset: { compaction: record.compaction_count ?? record.id } },
  h("div", { class: "marker-line" },
    h("strong", {}, `Compaction ${record.compaction_count ?? record.id}`),
    h("span", {}, parts.join(" · ")),
    reverted ? badge("undone by /uncompact", "badge-muted") : null,
    time(record.created_at)),
  h("details", {}, h("summary", {}, "Summary"), h("div", { class: "msg-body" }, record.summary || "")));
}

/** Compaction records by the seq they end at; a compaction undone by /uncompact is marked. */
function markers(records) {
  const active = [];
  const reverted = new Set();
  for (const r of records) {
    if (r.type === "compaction") active.push(r);
    else if (r.type === "uncompact") {
      const i = active.findLastIndex((c) => (c.compaction_count ?? c.id) === r.reverts);
      if (i >= 0) reverted.add(active.splice(i, 1)[0]);
    }
  }
  const byEnd = new Map();
  for (const r of records.filter((x) => x.type === "compaction")) {
    const list = byEnd.get(r.end_seq) || [];
    list.push(markerFor(r, reverted.has(r)));
    byEnd.set(r.end_seq, list);
  }
  return byEnd;
}

export class Transcript {
  constructor(runId) {
    this.runId = runId;
    this.list = h("ol", { class: "messages", "aria-label": "Transcript" });
    this.more = h("button", { type: "button", class: "btn", hidden: true }, "Load more messages");
    this.more.addEventListener("click", () => this.queue(() => this.page()));
    this.box = h("div", { class: "scrollbox" }, this.list, this.more);
    this.element = h("div", { class: "transcript" }, this.box);
    this.after = 0;
    this.done = false;
    this.byEnd = new Map();
    this.chain = Promise.resolve();
  }

  queue(task) {
    this.chain = this.chain.then(task).catch(showError);
    return this.chain;
  }

  /** (Re)load from the first message; the old content stays until the new one is here. */
  load() {
    return this.queue(async () => {
      const { summaries } = await get(runPath(this.runId, "/summaries"));
      const data = await this.fetchPage(0);
      const extent = this.after;
      const atEnd = this.atEnd();
      this.byEnd = markers(summaries);
      this.after = 0;
      replace(this.list);
      this.show(data);
      while (!this.done && this.after < extent) this.show(await this.fetchPage(this.after));
      if (!this.list.children.length) this.list.append(h("li", { class: "empty" }, "No messages yet."));
      if (atEnd) this.scrollToEnd();
    });
  }

  fetchPage(after) {
    return get(runPath(this.runId, "/messages"), { after_seq: after, limit: PAGE });
  }

  async page() {
    return this.show(await this.fetchPage(this.after));
  }

  show(data) {
    if (data.messages.length) this.list.querySelector(":scope > li.empty")?.remove();
    for (const m of data.messages) {
      this.list.append(renderMessage(m));
      for (const marker of this.byEnd.get(m.seq) || []) this.list.append(marker);
      this.after = m.seq;
    }
    this.done = data.next_after_seq === null;
    this.more.hidden = this.done;
    return data.messages.length;
  }

  /** New messages appended since the last page (live updates); only once everything is loaded. */
  catchUp() {
    return this.queue(async () => {
      const atEnd = this.atEnd();
      while (this.done && (await this.page()) === PAGE);
      if (atEnd) this.scrollToEnd();
    });
  }

  /** Load pages until message `seq` is shown, then scroll to it and mark it (history search links). */
  jumpTo(seq) {
    return this.queue(async () => {
      while (!this.done && this.after < seq) await this.page();
      const item = this.list.querySelector(`:scope > li[data-seq="${Number(seq)}"]`);
      if (!item) return;
      item.classList.add("msg-target");
      item.setAttribute("aria-current", "true");
      item.scrollIntoView({ block: "center" });
    });
  }

  atEnd() {
    const box = this.box;
    return !box.isConnected || box.scrollHeight - box.scrollTop - box.clientHeight < 120;
  }

  scrollToEnd() {
    this.box.scrollTop = this.box.scrollHeight;
  }
}

export function renderTools(records) {
  if (!records.length) return empty("No tool calls in this run.");
  return h("ol", { class: "cards" }, records.map((t) => h("li", { class: "card" },
    h("header", { class: "card-head" },
      h("strong", {}, h("code", {}, t.tool_name)), h("span", { class: "muted" }, `#${t.seq}`),
      t.error ? badge("error", "badge-failed") : null,
      t.duration_ms !== undefined && t.duration_ms !== null ? h("span", { class: "muted" }, `${Math.round(t.duration_ms)} ms`) : null,
      time(t.timestamp)),
    h("div", { class: "kv-pre" },
      h("div", {}, h("h4", {}, "Arguments"), h("pre", { class: "code" }, pretty(t.arguments ?? null))),
      h("div", {}, h("h4", {}, t.error ? "Error" : "Result"),
        h("pre", { class: "code" }, t.error ? t.error : pretty(t.result ?? null)))))));
}

export function renderPlans(records) {
  if (!records.length) return empty("No plans in this run.");
  return h("ol", { class: "cards" }, records.map((p) => h("li", { class: "card" },
    h("header", { class: "card-head" }, badge(p.plan_type, "badge-muted"), h("span", { class: "muted" }, `#${p.id}`),
      time(p.created_at)),
    h("div", { class: "msg-body" }, p.plan_content))));
}

/** One run of a key's history: status, dates, statistics, the final summary when it has one. */
export function runCard(run, finalSummary) {
  const active = run.status === "running" || run.status === "paused";
  const stats = [
    // the ledger's totals are written when a run completes
    ...(active ? [] : [`${num(run.total_messages)} messages`, `${num(run.total_summaries)} summaries`,
      `${num(run.total_tool_calls)} tool calls`]),
    `${num(run.compaction_count)} compactions`,
    `${num(run.input_tokens)} in / ${num(run.output_tokens)} out tokens`,
  ];
  return h("li", { class: "card run-card", dataset: { run: run.uuid } },
    h("header", { class: "card-head" },
      h("a", { href: runHref(run.uuid), class: "mono" }, shortId(run.uuid)),
      badge(run.status), run.archived ? badge("archived", "badge-muted") : null,
      h("span", { class: "muted small" }, `started ${when(run.created_at)}`,
        run.completed_at ? ` · ended ${when(run.completed_at)}` : "")),
    h("p", { class: "muted small" }, stats.join(" · ")),
    run.parent_uuid ? h("p", { class: "small" }, "Inherits from ",
      h("a", { href: runHref(run.parent_uuid), class: "mono" }, shortId(run.parent_uuid))) : null,
    run.error_message ? h("p", { class: "error-text" }, run.error_message) : null,
    finalSummary === undefined ? null
      : h("div", { class: "final-summary" }, h("h4", {}, "Final summary"),
        finalSummary === null ? empty("No final summary.") : h("div", { class: "msg-body" }, finalSummary)));
}
