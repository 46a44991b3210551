// One run, active, completed or archived: its ledger row, final summary, transcript, tools, plans.

import { get, live, runPath } from "./api.js";
import { empty, h, replace, sessionHref, spinner } from "./dom.js";
import { Transcript, renderPlans, renderTools, runCard } from "./transcript.js";
import { tabs } from "./ui.js";

const TABS = [["transcript", "Transcript"], ["tools", "Tool calls"], ["plans", "Plans"]];

export function mountRun(root, id, query = new URLSearchParams()) {
  const target = Number(query.get("seq")) || null;
  const head = h("div", {}, spinner());
  const panel = h("section", { class: "panel", role: "tabpanel" });
  let current = "transcript";
  let transcript = null;
  let renderId = 0;
  const title = h("h1", { class: "mono key-title" }, `Run ${id}`);
  const crumbs = h("nav", { class: "crumbs" }, h("a", { href: "#/sessions" }, "← Sessions"));
  replace(root, crumbs, title, head, tabs(TABS, current, (name) => { current = name; renderTab(); }), panel);

  async function renderTab() {
    const mine = ++renderId;
    const box = h("div", { class: "tab-body" }, spinner());
    replace(panel, box);
    transcript = null;
    try {
      let parts;
      if (current === "transcript") {
        transcript = new Transcript(id);
        await transcript.load();
        parts = [transcript.element];
        if (target) transcript.jumpTo(target);
      } else if (current === "tools") {
        parts = [renderTools((await get(runPath(id, "/tools"))).tools)];
      } else {
        parts = [renderPlans((await get(runPath(id, "/planning"))).planning)];
      }
      if (mine === renderId) replace(box, parts);
    } catch (error) {
      if (mine === renderId) replace(box, empty(`Could not load: ${error.message}`));
    }
  }

  async function load() {
    try {
      const run = await get(runPath(id));
      let finalSummary;
      if (run.status === "completed" || run.status === "failed") {
        finalSummary = await get(runPath(id, "/final-summary")).then((r) => r.final_summary, () => null);
      }
      replace(crumbs, h("a", { href: sessionHref(run.session_key) }, `← ${run.session_key}`));
      replace(head, h("ol", { class: "cards" }, runCard(run, finalSummary)));
      await renderTab();
    } catch (error) {
      replace(head, empty(`Could not load this run: ${error.message}`));
    }
  }

  const unsubscribe = live.subscribe((event) => {
    if (event.run_id === id && (event.type === "message" || event.type === "reply") && transcript) transcript.catchUp();
  });
  load();
  return unsubscribe;
}
