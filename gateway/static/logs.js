// The gateway's log, live: the last lines of logs/gateway.log, then what is written next
// (GET /v1/admin/logs polled with the offset of the previous answer).

import { get } from "./api.js";
import { h, replace } from "./dom.js";

const POLL_MS = 1500;
const KEEP = 2000;

export function mountLogs(root) {
  const filter = h("input", { type: "search", name: "filter", placeholder: "filter lines", size: 24 });
  const follow = h("input", { type: "checkbox", name: "follow", checked: true });
  const state = h("span", { class: "muted small", role: "status" }, "loading…");
  const pre = h("pre", { class: "log-tail", tabindex: "0", "aria-label": "gateway.log" });
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Log"), state, h("span", { class: "spacer" }),
    filter, h("label", { class: "check" }, follow, " follow")), pre);
  let lines = [];
  let offset = null;
  let inode = null;
  let stopped = false;
  let timer = null;

  function render() {
    const needle = filter.value.trim().toLowerCase();
    const shown = needle ? lines.filter((l) => l.toLowerCase().includes(needle)) : lines;
    pre.textContent = shown.join("\n");
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  async function poll() {
    try {
      const query = offset === null ? { lines: 300 } : { after: offset, inode: inode ?? "" };
      const data = await get("/v1/admin/logs", query);
      if (stopped) return;
      if (data.rotated) lines.push("── the log was rotated ──");
      lines = lines.concat(data.lines).slice(-KEEP);
      offset = data.offset;
      inode = data.inode;
      state.textContent = `${data.file} · live`;
      if (data.lines.length || data.rotated || pre.textContent === "") render();
    } catch (error) {
      if (!stopped) state.textContent = `not following: ${error.message}`;
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  filter.addEventListener("input", render);
  poll();
  return () => { stopped = true; clearTimeout(timer); };
}
