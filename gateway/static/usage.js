// Token usage per UTC day and agent (GET /v1/usage?by=agent) as a stacked bar chart in plain SVG,
// with the table of the same figures and each agent's daily budget.

import { get } from "./api.js";
import { empty, h, num, replace, spinner } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#ec4899", "#14b8a6", "#84cc16"];
const DAYS = [7, 14, 30, 90];

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const child of children) if (child) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

function isoDay(date) { return date.toISOString().slice(0, 10); }

function daysBack(count) {
  const today = new Date();
  const days = [];
  for (let i = count - 1; i >= 0; i -= 1) days.push(isoDay(new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i))));
  return days;
}

/** Stacked bars: one per day, a segment per agent, with a y axis of four ticks. */
function chart(days, agents, totals) {
  const width = 760, height = 260, left = 56, bottom = 28, top = 12;
  const plotW = width - left - 8, plotH = height - top - bottom;
  const max = Math.max(1, ...days.map((d) => agents.reduce((sum, a) => sum + (totals[d]?.[a] || 0), 0)));
  const step = plotW / days.length;
  const barW = Math.max(2, step * 0.7);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "usage-chart", role: "img",
    "aria-label": "Tokens per day per agent" });
  for (let i = 0; i <= 4; i += 1) {
    const y = top + plotH - (plotH * i) / 4;
    svg.append(s("line", { x1: left, x2: width - 8, y1: y, y2: y, class: "grid" }),
      s("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "tick" }, num(Math.round((max * i) / 4))));
  }
  days.forEach((day, i) => {
    let y = top + plotH;
    const x = left + i * step + (step - barW) / 2;
    agents.forEach((agent, j) => {
      const value = totals[day]?.[agent] || 0;
      if (!value) return;
      const barH = (plotH * value) / max;
      y -= barH;
      svg.append(s("rect", { x, y, width: barW, height: barH, fill: PALETTE[j % PALETTE.length],
        "data-day": day, "data-agent": agent, "data-tokens": value }, s("title", {}, `${day} ${agent}: ${num(value)} tokens`)));
    });
    if (days.length <= 14 || i % Math.ceil(days.length / 10) === 0) {
      svg.append(s("text", { x: x + barW / 2, y: height - 8, "text-anchor": "middle", class: "tick" }, day.slice(5)));
    }
  });
  return svg;
}

function legend(agents, limits) {
  return h("ul", { class: "legend" }, agents.map((agent, j) => {
    const swatch = h("span", { class: "swatch" });
    swatch.style.background = PALETTE[j % PALETTE.length];
    const limit = limits[agent] || {};
    const budget = limit.tokens_per_day ? ` · budget ${num(limit.tokens_per_day)}/day` : "";
    const perKey = limit.tokens_per_key_per_day ? ` · ${num(limit.tokens_per_key_per_day)}/key/day` : "";
    return h("li", {}, swatch, agent, h("span", { class: "muted small" }, budget + perKey));
  }));
}

export function mountUsage(root, query) {
  const span = DAYS.includes(Number(query.get("days"))) ? Number(query.get("days")) : 14;
  const picker = h("select", { name: "days", "aria-label": "Days shown" },
    DAYS.map((d) => h("option", { value: d, selected: d === span }, `last ${d} days`)));
  picker.addEventListener("change", () => { location.hash = `#/usage?days=${picker.value}`; });
  const body = h("div", {}, spinner());
  replace(root, h("div", { class: "view-head" }, h("h1", {}, "Usage"),
    h("span", { class: "muted small" }, "Input + output tokens per UTC day"), h("span", { class: "spacer" }), picker), body);
  let stopped = false;
  async function load() {
    const days = daysBack(span);
    try {
      const data = await get("/v1/usage", { by: "agent", from: days[0], to: days[days.length - 1] });
      if (stopped) return;
      const totals = {};
      const agents = [...new Set([...Object.keys(data.limits), ...data.usage.map((r) => r.agent)])].sort();
      for (const r of data.usage) (totals[r.day] ||= {})[r.agent] = r.total_tokens;
      const used = agents.filter((a) => data.usage.some((r) => r.agent === a));
      const figures = ["Input", "Output", "Cache read", "Calls", "Total"];
      const table = h("table", { class: "table usage-table" },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Day"), h("th", { scope: "col" }, "Agent"),
          figures.map((c) => h("th", { scope: "col", class: "num" }, c)))),
        h("tbody", {}, [...data.usage].reverse().map((r) => h("tr", { dataset: { day: r.day, agent: r.agent } },
          // each cell carries its column's name: at phone width the header row is hidden and CSS shows it
          h("td", { dataset: { label: "Day" } }, r.day), h("td", { dataset: { label: "Agent" } }, r.agent),
          [r.input_tokens, r.output_tokens, r.cache_read_tokens, r.calls, r.total_tokens].map((v, i) =>
            h("td", { class: "num", dataset: { label: figures[i] } }, num(v)))))));
      replace(body,
        data.usage.length ? h("div", { class: "usage-panel" }, chart(days, used, totals), legend(used, data.limits))
          : empty("No model calls in these days."),
        h("p", { class: "muted" }, `Total: ${num(data.totals.total_tokens)} tokens in ${num(data.totals.calls)} calls.`),
        data.usage.length ? h("div", { class: "table-wrap" }, table) : null);
    } catch (error) {
      if (!stopped) replace(body, empty(`Could not load the usage: ${error.message}`));
    }
  }
  load();
  const timer = setInterval(load, 30000);
  return () => { stopped = true; clearInterval(timer); };
}
