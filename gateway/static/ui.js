// Page-wide widgets: notices, the confirm dialog, the token dialog, tabs.

import { h } from "./dom.js";

export function notify(text, kind = "info") {
  const region = document.getElementById("notices");
  const close = h("button", { class: "notice-close", type: "button", "aria-label": "Dismiss" }, "×");
  const notice = h("div", { class: `notice notice-${kind}`, role: kind === "error" ? "alert" : "status" },
    h("span", { class: "notice-text" }, text), close);
  close.addEventListener("click", () => notice.remove());
  region.append(notice);
  while (region.children.length > 4) region.firstElementChild.remove();
  setTimeout(() => notice.remove(), kind === "error" ? 12000 : 6000);
}

export function showError(error) {
  notify(error && error.message ? error.message : String(error), "error");
}

/**
 * A modal dialog. Resolves to false when cancelled; to true, or the input's text when
 * `input` is given, when confirmed.
 */
export function confirmDialog({ title, body, confirm = "Confirm", danger = false, input = null }) {
  return new Promise((resolve) => {
    const field = input ? h("input", { type: "text", name: "input", placeholder: input, "aria-label": input }) : null;
    const dialog = h("dialog", { class: "dialog", "aria-label": title },
      h("form", { method: "dialog" },
        h("h2", {}, title),
        body ? h("p", {}, body) : null,
        field,
        h("div", { class: "dialog-actions" },
          // the confirming button first: Enter in the input submits with it (row-reverse puts it on the right)
          h("button", { type: "submit", value: "ok", class: danger ? "btn btn-danger" : "btn btn-primary" }, confirm),
          h("button", { type: "submit", value: "cancel", class: "btn" }, "Cancel"))));
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      dialog.remove();
      resolve(ok ? (field ? field.value.trim() : true) : false);
    });
    document.body.append(dialog);
    dialog.showModal();
    (field || dialog.querySelector("button[value=ok]")).focus();
  });
}

/** Asks for the gateway token; `check(token)` resolves to an error text, or null when accepted. */
export function tokenDialog(check, problem = "") {
  return new Promise((resolve) => {
    const field = h("input", {
      type: "password", name: "token", autocomplete: "off", required: true, "aria-label": "Token",
      placeholder: "one of gateway.tokens",
    });
    const error = h("p", { class: "dialog-error", role: "alert" }, problem);
    const submit = h("button", { type: "submit", class: "btn btn-primary" }, "Continue");
    const form = h("form", {},
      h("h2", {}, "Token required"),
      h("p", {}, "This gateway has tokens configured. Enter one; it is kept for this tab only."),
      field, error,
      h("div", { class: "dialog-actions" }, submit));
    const dialog = h("dialog", { class: "dialog", id: "token-dialog", "aria-label": "Token required" }, form);
    dialog.addEventListener("cancel", (event) => event.preventDefault());
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      submit.disabled = true;
      const problemText = await check(field.value.trim());
      submit.disabled = false;
      if (problemText) {
        error.textContent = problemText;
        field.select();
        return;
      }
      dialog.close();
      dialog.remove();
      resolve();
    });
    document.body.append(dialog);
    dialog.showModal();
    field.focus();
  });
}

/** Tabs over panels built on demand; `onChange(name)` is called when the user picks one. */
export function tabs(names, current, onChange) {
  const list = h("div", { class: "tabs", role: "tablist" });
  for (const [name, label] of names) {
    const tab = h("button", {
      type: "button", role: "tab", class: "tab", "aria-selected": String(name === current), dataset: { tab: name },
    }, label);
    tab.addEventListener("click", () => {
      for (const other of list.children) other.setAttribute("aria-selected", String(other === tab));
      onChange(name);
    });
    list.append(tab);
  }
  return list;
}
