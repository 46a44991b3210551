// Memory: index status, reindex with progress (memory events), search with scores and citations,
// the files and their text.

import { get, live, post } from "./api.js";
import { badge, bar, empty, h, hashHref, num, replace, spinner, when } from "./dom.js";
import { notify, showError } from "./ui.js";

const filePath = (path) => `/v1/memory/files/${path.split("/").map(encodeURIComponent).join("/")}`;

const seconds = (s) => (s >= 90 ? `${Math.round(s / 60)} min` : `${Math.max(1, Math.round(s))} s`);

// The pass in flight (status.progress): chunks embedded of those it must embed, rate, time left.
function progressView(p) {
  const parts = [`${num(p.done)} / ${num(p.total)} chunks`];
  if (p.chunks_per_second) parts.push(`${Number(p.chunks_per_second).toFixed(1)} chunks/s`);
  if (p.seconds_left !== null && p.seconds_left !== undefined) parts.push(`${seconds(p.seconds_left)} left`);
  return h("span", { class: "indexing" }, bar(p.done, p.total, parts.join(" · "), true));
}

// What answers a search now: during a rebuild for another embedder, the old index (its own vectors,
// or its text side alone when its model cannot load).
function servingView(v) {
  if (!v || !v.replacing) return null;
  const how = v.vectors ? "with its own model's vectors" : "by its text alone";
  return h("span", { class: v.vectors ? "muted small" : "error-text" },
    `Searches use the ${v.provider} index ${how} until the ${v.replacing.provider} index is complete`
    + (v.note ? ` (${v.note}).` : "."));
}

function statusView(s) {
  const item = (label, ...value) => h("div", { class: "meta-item" }, h("dt", {}, label), h("dd", {}, ...value));
  const wide = (label, ...value) => h("div", { class: "meta-item meta-wide" }, h("dt", {}, label), h("dd", {}, ...value));
  const id = s.identity || {};
  const last = s.last_run || null;
  return h("dl", { class: "meta" },
    item("Index", s.ready ? badge("ready", "badge-running") : badge("not ready", "badge-paused"),
      s.rebuilding ? badge("rebuilding", "badge-paused") : null),
    item("Files", num(s.files)),
    item("Chunks", num(s.chunks)),
    item("Pending", num(s.pending)),
    s.progress ? wide("Indexing", progressView(s.progress)) : null,
    s.serving && s.serving.replacing ? wide("Searches", servingView(s.serving)) : null,
    wide("Embeddings", [id.provider, id.model, id.dimensions ? `${id.dimensions} dims` : null].filter(Boolean).join(" · ")
      || "–"),
    wide("Last run", last ? `${when(last.finished_at)} · ${num(last.files_changed)} changed · `
      + `${num(last.chunks_embedded)} embedded · ${Number(last.seconds || 0).toFixed(2)} s` : "never"),
    s.last_error ? wide("Last error", h("span", { class: "error-text" }, s.last_error)) : null);
}

export function mountMemory(root, query) {
  const agent = query.get("agent") || "main";
  const statusBox = h("div", {}, spinner());
  const progress = h("div", { class: "progress", hidden: true });
  const force = h("input", { type: "checkbox", name: "force" });
  const reindexButton = h("button", { type: "button", class: "btn" }, "Reindex");
  const results = h("div", { class: "results", "aria-live": "polite" });
  const filesBox = h("div", {}, spinner());
  const viewer = h("div", { class: "viewer", hidden: true });
  const q = h("input", { type: "search", name: "q", placeholder: "Search memory…", "aria-label": "Search memory",
    value: query.get("q") || "" });
  const k = h("input", { type: "number", name: "k", min: 1, max: 100, value: 6, "aria-label": "Results", class: "narrow" });
  const searchForm = h("form", { class: "search", role: "search" }, q, k,
    h("button", { type: "submit", class: "btn btn-primary" }, "Search"));
  const agentForm = h("form", { class: "inline-form" },
    h("label", { class: "field" }, h("span", {}, "Agent"), h("input", { name: "agent", value: agent, size: 10 })),
    h("button", { type: "submit", class: "btn" }, "Show"));

  agentForm.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = hashHref("/memory", { agent: new FormData(agentForm).get("agent") });
  });
  searchForm.addEventListener("submit", (event) => { event.preventDefault(); search(); });
  reindexButton.addEventListener("click", reindex);

  replace(root,
    h("div", { class: "view-head" }, h("h1", {}, "Memory"), agentForm),
    h("div", { class: "columns" },
      h("section", { class: "column-main" }, searchForm, results, viewer),
      h("aside", { class: "column-side" },
        h("section", { class: "box" }, h("h2", {}, "Index"), statusBox,
          h("div", { class: "reindex" }, reindexButton,
            h("label", { class: "check" }, force, " rebuild everything (force)")),
          progress),
        h("section", { class: "box" }, h("h2", {}, "Files"), filesBox))));

  // while a pass is in flight (or this page's reindex runs) the status is read again every
  // POLL_MS, so the console shows a rebuild's progress, whoever started it
  const POLL_MS = 250;
  let timer = null;
  let reindexing = false;
  let gone = false;
  async function loadStatus() {
    clearTimeout(timer);
    let again = reindexing;
    try {
      const s = await get("/v1/memory/status");
      replace(statusBox, statusView(s));
      again = again || Boolean(s.progress);
    } catch (error) {
      replace(statusBox, empty(`Status unavailable: ${error.message}`));
    }
    if (again && !gone) timer = setTimeout(loadStatus, again && !reindexing ? 1000 : POLL_MS);
  }

  async function loadFiles() {
    try {
      const { files } = await get("/v1/memory/files", { agent });
      if (!files.length) {
        replace(filesBox, empty("No memory files: write MEMORY.md or memory/*.md in the agent's workspace."));
        return;
      }
      replace(filesBox, h("ul", { class: "files" }, files.map((f) => h("li", {},
        h("button", { type: "button", class: "link", onclick: () => openFile(f.path) }, f.path),
        h("span", { class: "muted small" }, ` ${num(f.size)} B · ${when(new Date(f.mtime * 1000).toISOString())}`)))));
    } catch (error) {
      replace(filesBox, empty(`Files unavailable: ${error.message}`));
    }
  }

  async function openFile(path, from = 0, to = 0) {
    try {
      const { text } = await get(filePath(path), { agent });
      const lines = text.split("\n");
      if (lines.length && lines[lines.length - 1] === "") lines.pop();
      const pre = h("pre", { class: "file" }, lines.map((line, i) => h("span", {
        class: `line ${i + 1 >= from && i + 1 <= to ? "hl" : ""}`,
      }, h("span", { class: "ln", "aria-hidden": "true" }, String(i + 1)), `${line}\n`)));
      const close = h("button", { type: "button", class: "btn btn-small" }, "Close");
      close.addEventListener("click", () => { viewer.hidden = true; });
      replace(viewer, h("div", { class: "viewer-head" }, h("strong", { class: "mono" }, path),
        from ? h("span", { class: "muted" }, ` lines ${from}–${to}`) : null, close), pre);
      viewer.hidden = false;
      (pre.querySelector(".hl") || viewer).scrollIntoView({ block: "center" });
    } catch (error) {
      showError(error);
    }
  }

  async function search() {
    const text = q.value.trim();
    if (!text) return;
    replace(results, spinner("Searching…"));
    try {
      const data = await get("/v1/memory/search", { q: text, agent, k: k.value });
      if (!data.results.length) {
        replace(results, empty("Nothing in memory clears the threshold for this query."));
        return;
      }
      replace(results, h("ol", { class: "cards hits" }, data.results.map((r) => h("li", { class: "card hit" },
        h("header", { class: "card-head" },
          h("button", { type: "button", class: "link mono citation",
            onclick: () => openFile(r.path, r.start_line, r.end_line) }, r.citation),
          r.heading ? h("span", { class: "muted" }, r.heading) : null),
        h("div", { class: "hit-score" }, bar(r.score, 1, `score ${Number(r.score).toFixed(3)}`, true),
          r.vector_score !== undefined ? h("span", { class: "muted small" },
            `vector ${Number(r.vector_score).toFixed(2)} · text ${Number(r.text_score || 0).toFixed(2)}`) : null),
        h("div", { class: "msg-body snippet" }, r.snippet)))));
    } catch (error) {
      replace(results, empty(`Search failed: ${error.message}`));
    }
  }

  function showProgress(done, total) {
    progress.hidden = false;
    replace(progress, bar(done, total, total ? `${num(done)} / ${num(total)} files` : "starting…", true));
  }

  async function reindex() {
    reindexButton.disabled = true;
    showProgress(0, 0);
    reindexing = true;
    loadStatus();
    try {
      const { report } = await post("/v1/memory/reindex", { agent, force: force.checked });
      notify(`Reindexed: ${num(report.files_scanned)} files scanned, ${num(report.files_changed)} changed, `
        + `${num(report.chunks_embedded)} chunks embedded in ${Number(report.seconds).toFixed(2)} s.`);
      replace(progress, h("span", { class: "muted small" }, `Done at ${new Date().toLocaleTimeString()}.`));
    } catch (error) {
      progress.hidden = true;
      showError(error);
    } finally {
      reindexButton.disabled = false;
      reindexing = false;
      loadStatus();
      loadFiles();
    }
  }

  const unsubscribe = live.subscribe((event) => {
    if (event.type === "memory" && event.action === "progress") showProgress(event.done, event.total);
  });
  loadStatus();
  loadFiles();
  if (q.value) search();
  return () => { gone = true; clearTimeout(timer); unsubscribe(); };
}
