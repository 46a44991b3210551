// The console's entry point: the token for the tab, the hash router, the live-connection badge.

import { auth, get, live, onUnauthorized } from "./api.js";
import { empty, h, replace } from "./dom.js";
import { mountBackups } from "./backups.js";
import { mountChannels } from "./channels.js";
import { mountConfig } from "./config.js";
import { mountCron } from "./cron.js";
import { mountLogs } from "./logs.js";
import { mountMemory } from "./memory.js";
import { mountRun } from "./run.js";
import { mountSearch } from "./search.js";
import { mountSession } from "./session.js";
import { mountSessions } from "./sessions.js";
import { mountUsage } from "./usage.js";
import { tokenDialog } from "./ui.js";

const view = document.getElementById("view");
const OWN_SECTIONS = ["memory", "search", "channels", "cron", "usage", "logs", "config", "backups"];
let unmount = () => {};
let asking = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/sessions";
  const [path, search = ""] = raw.split("?", 2);
  const parts = path.split("/").filter(Boolean);
  return { parts, query: new URLSearchParams(search) };
}

function route() {
  unmount();
  unmount = () => {};
  const { parts, query } = parseHash();
  const [section] = parts;
  // a session key or run id is the rest of the path: a key may hold "/", and a link whose %2F a
  // tool unescaped (yarl, some chat clients) still opens its session
  const arg = parts.slice(1).join("/");
  for (const link of document.querySelectorAll(".nav a")) {
    link.setAttribute("aria-current", String(link.dataset.section === (OWN_SECTIONS.includes(section) ? section : "sessions")));
  }
  let cleanup;
  try {
    if (section === "session" && arg) cleanup = mountSession(view, decodeURIComponent(arg), query);
    else if (section === "run" && arg) cleanup = mountRun(view, decodeURIComponent(arg), query);
    else if (section === "search") cleanup = mountSearch(view, query);
    else if (section === "memory") cleanup = mountMemory(view, query);
    else if (section === "channels") cleanup = mountChannels(view);
    else if (section === "cron") cleanup = mountCron(view);
    else if (section === "usage") cleanup = mountUsage(view, query);
    else if (section === "logs") cleanup = mountLogs(view);
    else if (section === "config") cleanup = mountConfig(view);
    else if (section === "backups") cleanup = mountBackups(view);
    else if (!section || section === "sessions") cleanup = mountSessions(view, query);
    else replace(view, empty("No such page."), h("a", { href: "#/sessions" }, "Back to the sessions"));
  } catch (error) {
    replace(view, empty(`This page could not be shown: ${error.message}`));
  }
  unmount = cleanup || (() => {});
  view.focus({ preventScroll: true });
  window.scrollTo(0, 0);
}

async function checkToken(token) {
  if (!token) return "Enter a token.";
  auth.set(token);
  try {
    await get("/v1/sessions", { limit: 1 });
    return null;
  } catch (error) {
    auth.clear();
    return error.status === 401 ? "The gateway refused this token." : `The gateway did not answer: ${error.message}`;
  }
}

/** Ask for a token (once at a time), then reconnect the event stream and redraw the page. */
function askForToken(problem = "") {
  if (!asking) {
    asking = tokenDialog(checkToken, problem).then(() => {
      asking = null;
      document.getElementById("forget").hidden = false;
      live.connect();
      route();
    });
  }
  return asking;
}

function liveBadge(state) {
  const el = document.getElementById("live");
  el.dataset.state = state;
  el.textContent = { live: "live", connecting: "connecting…", off: "offline" }[state] || state;
  el.title = state === "live" ? "Receiving /v1/events" : "Not receiving live updates";
}

function start() {
  live.onState(liveBadge);
  onUnauthorized(() => {
    if (!asking && auth.required) {
      auth.clear();
      live.close();
      askForToken("The gateway refused the token; enter it again.");
    }
  });
  const forget = document.getElementById("forget");
  forget.hidden = !(auth.required && auth.token);
  forget.addEventListener("click", () => {
    auth.clear();
    live.close();
    forget.hidden = true;
    unmount();
    replace(view);
    askForToken();
  });
  window.addEventListener("hashchange", route);
  if (auth.required && !auth.token) {
    askForToken();
    return;
  }
  live.connect();
  route();
}

start();
