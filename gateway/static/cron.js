// Scheduled jobs (GET /v1/scheduler/jobs): next run, the last runs with their outcome, run now.

import { get, post } from "./api.js";
import { badge, empty, h, replace, sessionHref, spinner, time, when } from "./dom.js";
import { notify, showError } from "./ui.js";

const COLUMNS = ["Job", "Kind", "Schedule", "Next run", "Last runs", ""];
const REFRESH_MS = 5000;

/** Why a delivery did not arrive, or null: "not delivered to URL after N attempt(s): reason". */
function undelivered(delivery) {
  if (!delivery || delivery.delivered) return null;
  return `not delivered to ${delivery.url} after ${delivery.attempts} attempt(s): ${delivery.error || "no reason given"}`;
}

function outcome(firing) {
  const label = firing.ok ? (firing.status || "ok") : (firing.status || "failed");
  const problems = [firing.error, undelivered(firing.delivery)].filter(Boolean);
  const title = [when(firing.started_at), ...problems].join(" — ");
  return h("li", { class: "firing", title },
    badge(label, firing.ok ? "badge-running" : "badge-failed"), " ", time(firing.started_at),
    firing.error ? h("div", { class: "error-text small" }, firing.error) : null,
    undelivered(firing.delivery) ? h("div", { class: "error-text small delivery-error" }, undelivered(firing.delivery)) : null);
}

function row(job, runNow) {
  const cron = job.kind === "cron";
  const key = cron ? `cron:${job.id.replace(/^cron:/, "")}` : null;
  const button = h("button", { type: "button", class: "btn btn-small", disabled: job.running }, job.running ? "Running…" : "Run now");
  button.addEventListener("click", () => runNow(job, button));
  const runs = job.last_runs || [];
  return h("tr", { dataset: { job: job.id } },
    h("td", { dataset: { label: "Job" } }, h("span", { class: "mono" }, job.id),
      key ? h("div", { class: "small" }, h("a", { href: sessionHref(key) }, "session")) : null),
    h("td", { dataset: { label: "Kind" } }, job.kind),
    h("td", { dataset: { label: "Schedule" }, class: "mono small" }, job.trigger),
    h("td", { dataset: { label: "Next run" } }, job.next_run_at ? h("span", { title: job.next_run_at }, when(job.next_run_at)) : "–"),
    h("td", { dataset: { label: "Last runs" } }, runs.length
      ? h("ul", { class: "firings" }, runs.slice(0, 5).map(outcome))
      : h("span", { class: "muted" }, job.last_run_at ? `last ${when(job.last_run_at)}` : "not yet")),
    h("td", {}, button));
}

export function mountCron(root) {
  const body = h("div", { class: "table-wrap" }, spinner());
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Scheduled jobs"),
    h("span", { class: "muted small" }, "Last runs since the gateway started; newest first.")), body);
  let stopped = false;

  async function runNow(job, button) {
    button.disabled = true;
    button.textContent = "Running…";
    try {
      const result = await post(`/v1/scheduler/jobs/${encodeURIComponent(job.id)}/run`);
      notify(result.ok ? `${job.id}: ${result.status || "done"}` : `${job.id} failed: ${result.error || "see the last runs"}`,
        result.ok ? "info" : "error");
    } catch (error) {
      showError(error);
    }
    await load();
  }

  async function load() {
    try {
      const data = await get("/v1/scheduler/jobs");
      if (stopped) return;
      if (!data.jobs.length) { replace(body, empty("No scheduled jobs.")); return; }
      replace(body, h("table", { class: "table jobs-table" },
        h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, data.jobs.map((job) => row(job, runNow)))));
    } catch (error) {
      if (!stopped) replace(body, empty(`Could not load the jobs: ${error.message}`));
    }
  }
  load();
  const timer = setInterval(load, REFRESH_MS);
  return () => { stopped = true; clearInterval(timer); };
}
