// The effective configuration of the running gateway (GET /v1/admin/config), secrets masked by
// the gateway: where it came from, then each section folded open.

import { get } from "./api.js";
import { empty, h, pretty, replace, spinner } from "./dom.js";

export function mountConfig(root) {
  const body = h("div", {}, spinner());
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Configuration"),
    h("span", { class: "muted small" }, "in force now; secrets masked")), body);
  let stopped = false;
  (async () => {
    try {
      const data = await get("/v1/admin/config");
      if (stopped) return;
      const source = data.source || {};
      replace(body,
        h("dl", { class: "meta config-source" },
          ["kind", "config_path", "home"].map((k) => [h("dt", {}, k), h("dd", { class: "mono" }, source[k] ?? "none")])),
        Object.entries(data.settings).map(([section, value]) =>
          h("details", { class: "config-section", open: ["gateway", "agents"].includes(section), dataset: { section } },
            h("summary", {}, h("strong", {}, section)),
            h("pre", { class: "config-json" }, pretty(value)))));
    } catch (error) {
      if (!stopped) replace(body, empty(`Could not load the configuration: ${error.message}`));
    }
  })();
  return () => { stopped = true; };
}
