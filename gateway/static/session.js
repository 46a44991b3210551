// One session: its entry, the lifecycle buttons, transcript / context / tools / plans / history
// tabs, and a box to send a message. Live events for the key refresh what they change.

import { del, get, live, patch, post, runPath, sessionPath } from "./api.js";
import { badge, bar, empty, h, num, replace, runHref, shortId, spinner, time, when } from "./dom.js";
import { Transcript, renderMessage, renderPlans, renderTools, runCard, summaryCard } from "./transcript.js";
import { confirmDialog, notify, showError, tabs } from "./ui.js";

const TABS = [["transcript", "Transcript"], ["context", "Context"], ["tools", "Tool calls"], ["plans", "Plans"],
  ["history", "History"]];

function meta(entry) {
  const tokens = entry.tokens || {};
  const item = (label, ...value) => h("div", { class: "meta-item" }, h("dt", {}, label), h("dd", {}, ...value));
  return h("dl", { class: "meta" },
    item("Status", badge(entry.status), entry.pinned ? badge("pinned", "badge-pin") : null),
    item("Agent", entry.agent_id || "–"),
    item("Type", entry.chat_type, entry.channel ? ` · ${entry.channel}` : ""),
    item("Run", entry.run_id ? h("a", { href: runHref(entry.run_id), class: "mono", title: entry.run_id },
      shortId(entry.run_id)) : "none (idle)"),
    item("Model", entry.model || "store-only"),
    item("Last activity", time(entry.last_interaction_at || entry.created_at)),
    item("Tokens", bar(tokens.context || 0, tokens.threshold || entry.threshold || 0,
      `${num(tokens.context)} / ${num(tokens.threshold || entry.threshold)}`)),
    item("Compactions", num(entry.compactions)),
    item("Next reset", entry.next_reset ? h("span", { title: entry.next_reset }, when(entry.next_reset)) : "–"),
    item("Usage", `${num(tokens.input)} in · ${num(tokens.output)} out`));
}

function messageId() {
  return globalThis.crypto && crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
}

export function mountSession(root, key, query) {
  let current = TABS.some(([name]) => name === query.get("tab")) ? query.get("tab") : "transcript";
  let entry = null;
  let transcript = null;
  let renderId = 0;
  let gone = false;

  const head = h("div", { class: "session-head" }, spinner());
  const actions = h("div", { class: "actions", role: "toolbar", "aria-label": "Session actions" });
  const panel = h("section", { class: "panel", role: "tabpanel" });
  const tabBar = tabs(TABS, current, (name) => {
    current = name;
    history.replaceState(null, "", `#/session/${encodeURIComponent(key)}${name === "transcript" ? "" : `?tab=${name}`}`);
    renderTab();
  });

  const input = h("textarea", {
    name: "message", rows: 2, "aria-label": "Message",
    placeholder: "Message — Enter sends, Shift+Enter for a new line; /commands work too",
  });
  const send = h("button", { type: "submit", class: "btn btn-primary" }, "Send");
  const status = h("span", { class: "composer-status muted", role: "status" });
  const composer = h("form", { class: "composer" }, input, h("div", { class: "composer-side" }, send, status));
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
    }
  });
  composer.addEventListener("submit", (event) => { event.preventDefault(); sendMessage(); });

  replace(root,
    h("nav", { class: "crumbs" }, h("a", { href: "#/sessions" }, "← Sessions")),
    h("h1", { class: "key-title mono" }, key),
    head, actions, tabBar, panel, composer);

  async function sendMessage() {
    const content = input.value.trim();
    if (!content) return;
    send.disabled = true;
    status.textContent = "Waiting for the reply…";
    input.value = "";
    try {
      const answer = await post(sessionPath(key, "/messages"), { content, client_message_id: messageId() });
      for (const e of answer.events || []) {
        if (e.type === "inheritance") notify(e.comment || `Inherited the summary of run ${shortId(e.from_run_id || e.run_id)}`);
        if (e.type === "compaction") notify(`Context compacted (messages ${e.start_seq}–${e.end_seq}).`);
      }
      if (!answer.reply) status.textContent = "Stored.";
      else status.textContent = "";
      if (transcript && answer.run_id === transcript.runId) await transcript.catchUp();
      else await refresh();
      transcript?.scrollToEnd();
    } catch (error) {
      status.textContent = "";
      if (!input.value) input.value = content;
      showError(error);
    } finally {
      send.disabled = false;
      input.focus();
    }
  }

  async function command(text) {
    const answer = await post(sessionPath(key, "/commands"), { command: text });
    if (answer.reply) notify(answer.reply.content);
  }

  const ACTIONS = [
    ["Compact", "compact", () => !entry.run_id, async () => {
      const text = await confirmDialog({
        title: "Compact the context",
        body: "Older messages are summarized; the transcript keeps every message and /uncompact undoes it.",
        confirm: "Compact", input: "Instructions for the summary (optional)",
      });
      if (text !== false) await command(`/compact ${text}`.trim());
    }],
    ["Uncompact", "uncompact", () => !entry.run_id, () => command("/uncompact")],
    ["Reset", "reset", () => !entry.run_id, async () => {
      if (await confirmDialog({
        title: "Reset this session?", danger: true, confirm: "Reset",
        body: "The run is completed with a final summary. The next message starts a new run that inherits it.",
      })) await command("/reset");
    }],
    ["New", "new", () => false, async () => {
      if (await confirmDialog({
        title: "Start a new session?", danger: true, confirm: "Start new",
        body: "The run is completed. The next message starts a new run WITHOUT the previous summary.",
      })) await command("/new");
    }],
    ["Pause", "pause", () => entry.status !== "running", async () => {
      await post(sessionPath(key, "/pause"));
      notify("Paused: messages get 409 until you resume.");
    }],
    ["Resume", "resume", () => entry.status !== "paused", async () => {
      await post(sessionPath(key, "/resume"));
      notify("Resumed.");
    }],
    ["Pin", "pin", () => false, async () => {
      await patch(sessionPath(key), { pinned: !entry.pinned });
      notify(entry.pinned ? "Unpinned." : "Pinned: cleanup never touches this key's runs.");
    }],
    ["Delete", "delete", () => false, async () => {
      if (!(await confirmDialog({
        title: "Delete this session?", danger: true, confirm: "Delete",
        body: "The run is completed and the entry removed. Its runs stay readable in tasks.db.",
      }))) return;
      await del(sessionPath(key));
      notify(`Deleted ${key}.`);
      gone = true;
      location.hash = "#/sessions";
    }],
  ];

  function renderActions() {
    replace(actions, ACTIONS.map(([label, name, disabled, run]) => {
      const text = name === "pin" && entry.pinned ? "Unpin" : label;
      const danger = ["reset", "new", "delete"].includes(name);
      const button = h("button", {
        type: "button", class: `btn ${danger ? "btn-danger-outline" : ""}`, dataset: { action: name },
        disabled: disabled(),
      }, text);
      button.addEventListener("click", async () => {
        for (const b of actions.querySelectorAll("button")) b.disabled = true;
        try {
          await run();
        } catch (error) {
          showError(error);
        }
        if (!gone) await refresh();
      });
      return button;
    }));
  }

  async function loadEntry() {
    entry = await get(sessionPath(key));
    replace(head, meta(entry));
    renderActions();
  }

  async function refresh() {
    try {
      await loadEntry();
      await renderTab(true);
    } catch (error) {
      if (error.status === 404) {
        gone = true;
        replace(head, empty("This session no longer exists."));
        replace(actions);
        replace(panel);
        composer.hidden = true;
        return;
      }
      showError(error);
    }
  }

  /** Draws the current tab; `quiet` (a refresh) keeps what is shown until the new content is ready. */
  async function renderTab(quiet = false) {
    const mine = ++renderId;
    if (current === "transcript" && quiet && transcript && transcript.runId === shownRun()) {
      await transcript.load();
      return;
    }
    if (current !== "transcript") transcript = null;
    if (!quiet || !panel.firstElementChild) replace(panel, h("div", { class: "tab-body" }, spinner()));
    let parts;
    try {
      parts = await TAB_RENDERERS[current]();
    } catch (error) {
      parts = [empty(`Could not load: ${error.message}`)];
    }
    if (mine !== renderId) return;
    replace(panel, h("div", { class: "tab-body" }, parts));
    if (current === "transcript") transcript?.scrollToEnd();
  }

  const shownRun = () => entry.run_id || entry.last_run_id;

  const TAB_RENDERERS = {
    async transcript() {
      const runId = shownRun();
      const note = entry.run_id ? null : h("p", { class: "note" },
        "No active run: the next message starts a new one.",
        entry.last_run_id ? " Below is the last run." : "");
      if (!runId) return [note];
      transcript = new Transcript(runId);
      await transcript.load();
      return [note, transcript.element];
    },
    async context() {
      const ctx = await get(sessionPath(key, "/context"));
      const summaries = ctx.messages.filter((m) => m.kind === "summary" || m.kind === "inheritance");
      const system = ctx.messages.find((m) => m.kind === "system_prompt");
      const rest = ctx.messages.filter((m) => !summaries.includes(m) && m !== system);
      return [
        h("div", { class: "context-head" },
          bar(ctx.tokens, ctx.threshold, `${num(ctx.tokens)} of ${num(ctx.threshold)} tokens before compaction`),
          h("span", { class: "muted small" }, "The context as the model will see it next turn.")),
        ctx.run_id ? null : h("p", { class: "note" }, "No active run: the context starts with the next message."),
        summaries.map(summaryCard),
        system ? h("details", { class: "system-prompt" }, h("summary", {}, "System prompt"),
          h("div", { class: "msg-body" }, system.content)) : null,
        h("h3", {}, `Messages in context (${rest.length})`),
        rest.length ? h("ol", { class: "messages" }, rest.map(renderMessage)) : empty("None."),
      ];
    },
    async tools() {
      const runId = shownRun();
      if (!runId) return [empty("No run yet.")];
      return [renderTools((await get(runPath(runId, "/tools"))).tools)];
    },
    async plans() {
      const runId = shownRun();
      if (!runId) return [empty("No run yet.")];
      return [renderPlans((await get(runPath(runId, "/planning"))).planning)];
    },
    async history() {
      const list = h("ol", { class: "cards" });
      const more = h("button", { type: "button", class: "btn", hidden: true }, "Older runs");
      let cursor = null;
      const page = async () => {
        const data = await get("/v1/runs", { key, limit: 20, cursor });
        cursor = data.next_cursor;
        more.hidden = !cursor;
        const finals = await Promise.all(data.runs.map((run) => (
          ["completed", "failed"].includes(run.status)
            ? get(runPath(run.uuid, "/final-summary")).then((r) => r.final_summary, () => null)
            : undefined)));
        data.runs.forEach((run, i) => list.append(runCard(run, finals[i])));
        if (!list.children.length) list.append(h("li", {}, empty("No runs.")));
      };
      more.addEventListener("click", () => page().catch(showError));
      await page();
      return [list, more];
    },
  };

  let timer = null;
  const later = () => {
    clearTimeout(timer);
    timer = setTimeout(() => { if (!gone) refresh(); }, 250);
  };
  const unsubscribe = live.subscribe((event) => {
    if (event.key !== key || gone) return;
    const sameRun = transcript && event.run_id === transcript.runId && entry && entry.run_id === event.run_id;
    if ((event.type === "message" || event.type === "reply") && sameRun) {
      transcript.catchUp();
      loadEntry().catch(() => {});
    } else if (event.type !== "memory" || event.action !== "recall") {
      later();
    }
  });

  refresh();
  return () => { unsubscribe(); clearTimeout(timer); };
}
