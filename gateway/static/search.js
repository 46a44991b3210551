// History: full-text search over every transcript (active, completed and archived runs); each hit
// links to its message inside its run.

import { get } from "./api.js";
import { empty, h, hashHref, replace, sessionHref, shortId, spinner, when } from "./dom.js";

const ENTITIES = { "&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": "\"", "&#x27;": "'", "&#39;": "'" };
const unescape = (text) => text.replace(/&(lt|gt|amp|quot|#x27|#39);/g, (e) => ENTITIES[e]);

/** The API's snippet (escaped text, matches in <mark>) as nodes: text stays text. */
export function snippetNodes(snippet) {
  return snippet.split(/(<mark>.*?<\/mark>)/s).filter(Boolean).map((part) => part.startsWith("<mark>")
    ? h("mark", {}, unescape(part.slice(6, -7)))
    : unescape(part));
}

export function mountSearch(root, query) {
  const q = h("input", { type: "search", name: "q", placeholder: "Search every conversation…",
    "aria-label": "Search history", value: query.get("q") || "" });
  const key = h("input", { name: "key", placeholder: "session key (optional)", "aria-label": "Session key",
    value: query.get("key") || "" });
  const form = h("form", { class: "search", role: "search" }, q, key,
    h("button", { type: "submit", class: "btn btn-primary" }, "Search"));
  const results = h("div", { class: "results", "aria-live": "polite" });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = hashHref("/search", { q: q.value.trim(), key: key.value.trim() || undefined });
  });
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "History")), form, results);
  let cursor = null;

  async function load(more = false) {
    const text = query.get("q");
    if (!text) {
      replace(results, empty("Words to find in any message of any run, archived ones included."));
      return;
    }
    if (!more) replace(results, spinner("Searching…"));
    try {
      const params = { q: text, key: query.get("key") || undefined, cursor: more ? cursor : undefined };
      const body = await get("/v1/history/search", params);
      cursor = body.next_cursor;
      const list = more ? results.querySelector(".history-results") : h("ol", { class: "history-results" });
      for (const r of body.results) {
        list.append(h("li", { class: "history-hit", dataset: { run: r.run_id, seq: r.seq } },
          h("div", { class: "history-meta" },
            h("a", { href: sessionHref(r.session_key), class: "mono" }, r.session_key),
            h("a", { href: `#/run/${encodeURIComponent(r.run_id)}?seq=${r.seq}`, class: "hit-link" },
              `run ${shortId(r.run_id)} · #${r.seq}`),
            h("span", {}, r.role + (r.tool_result ? " (tool result)" : "")),
            r.timestamp ? h("time", { datetime: r.timestamp }, when(r.timestamp)) : null),
          h("p", { class: "snippet" }, snippetNodes(r.snippet))));
      }
      if (!more) {
        replace(results, body.results.length ? list : empty("No message matches."));
      }
      results.querySelector(".more")?.remove();
      if (cursor) {
        results.append(h("button", { type: "button", class: "btn more", onclick: () => load(true) }, "More results"));
      }
    } catch (error) {
      replace(results, empty(`Search failed: ${error.message}`));
    }
  }

  load();
  return () => {};
}
