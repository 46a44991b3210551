// Backups (GET /v1/admin/backups): the archives kept in <home>/backups, the last one this gateway
// took, and a button that takes one now (POST /v1/admin/backup).

import { get, post } from "./api.js";
import { empty, h, num, replace, spinner, time } from "./dom.js";
import { notify, showError } from "./ui.js";

const COLUMNS = ["Archive", "Size", "Path"];

function size(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

function last(summary) {
  if (!summary) return h("p", { class: "muted small last-backup" }, "No backup taken since the gateway started.");
  const counts = summary.counts || {};
  const item = (label, ...value) => h("div", { class: "meta-item" }, h("dt", {}, label), h("dd", {}, ...value));
  return h("dl", { class: "meta last-backup" },
    item("last backup", time(summary.created_at), ` (${summary.mode})`),
    item("holds", `${num(counts.runs || 0)} runs (${num(counts.active_runs || 0)} active), `
      + `${num(counts.files || 0)} files, ${size(summary.size)}`),
    h("div", { class: "meta-item meta-wide" }, h("dt", {}, "archive"), h("dd", { class: "mono small" }, summary.path)));
}

export function mountBackups(root) {
  const button = h("button", { type: "button", class: "btn" }, "Back up now");
  const body = h("div", {}, spinner());
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Backups"), button), body);
  let stopped = false;

  async function load() {
    try {
      const data = await get("/v1/admin/backups");
      if (stopped) return;
      const kept = data.keep ? `the newest ${data.keep} kept` : "all kept";
      replace(body, last(data.last),
        h("p", { class: "muted small" }, `In <home>/backups, newest first; ${kept} (backup.keep).`),
        data.backups.length
          ? h("div", { class: "table-wrap" }, h("table", { class: "table backups-table" },
            h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
            h("tbody", {}, data.backups.map((b) => h("tr", { dataset: { name: b.name } },
              h("td", { dataset: { label: "Archive" }, class: "mono" }, b.name),
              h("td", { dataset: { label: "Size" }, title: `${num(b.size)} bytes` }, size(b.size)),
              h("td", { dataset: { label: "Path" }, class: "mono small" }, b.path))))))
          : empty("No backups in <home>/backups yet."));
    } catch (error) {
      if (!stopped) replace(body, empty(`Could not list the backups: ${error.message}`));
    }
  }

  button.addEventListener("click", async () => {
    button.disabled = true;
    button.textContent = "Backing up…";
    try {
      const summary = await post("/v1/admin/backup");
      notify(`Backup written: ${summary.path} (${size(summary.size)})`, "info");
    } catch (error) {
      showError(error);
    }
    button.disabled = false;
    button.textContent = "Back up now";
    await load();
  });
  load();
  return () => { stopped = true; };
}
