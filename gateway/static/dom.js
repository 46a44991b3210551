// DOM building and formatting. Text is always set as text nodes or attributes, never parsed as HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "value") el.value = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function num(value) {
  return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
}

export function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  });
}

export function ago(iso) {
  if (!iso) return "–";
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (Number.isNaN(seconds)) return String(iso);
  const future = seconds < 0;
  const s = Math.abs(seconds);
  const [value, unit] = s < 45 ? [0, "now"] : s < 3600 ? [Math.round(s / 60), "min"]
    : s < 86400 ? [Math.round(s / 3600), "h"] : [Math.round(s / 86400), "d"];
  if (unit === "now") return "just now";
  return future ? `in ${value} ${unit}` : `${value} ${unit} ago`;
}

export function time(iso, relative = true) {
  return h("time", { datetime: iso || null, title: iso || null }, relative ? ago(iso) : when(iso));
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind || `badge-${String(text).toLowerCase()}`}` }, text);
}

/** A bar of value against max: green, amber from 80 %, red at or over (unless `plain`). */
export function bar(value, max, label, plain = false) {
  const ratio = max > 0 ? value / max : 0;
  const fill = h("span", { class: "bar-fill" });
  fill.style.width = `${Math.min(100, Math.max(ratio > 0 ? 1.5 : 0, ratio * 100)).toFixed(1)}%`;
  const level = plain ? "bar-plain" : ratio >= 1 ? "bar-over" : ratio >= 0.8 ? "bar-near" : "";
  return h("span", { class: `bar ${level}`, title: label || `${num(value)} / ${num(max)}` },
    h("span", { class: "bar-track", role: "meter", "aria-valuenow": value, "aria-valuemin": 0, "aria-valuemax": max },
      fill),
    h("span", { class: "bar-label" }, label ?? `${num(value)} / ${num(max)}`));
}

/** Pretty JSON for arguments and results; a string holding JSON is parsed first. */
export function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return value === undefined ? "" : JSON.stringify(value, null, 2);
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "–";
}

export function empty(text) {
  return h("p", { class: "empty" }, text);
}

export function spinner(text = "Loading…") {
  return h("p", { class: "loading" }, text);
}

export function hashHref(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) if (v !== null && v !== undefined && v !== "") params.set(k, v);
  const q = params.toString();
  return `#${path}${q ? `?${q}` : ""}`;
}

export const sessionHref = (key, tab) => hashHref(`/session/${encodeURIComponent(key)}`, { tab });
export const runHref = (id) => `#/run/${encodeURIComponent(id)}`;
