// Small DOM helpers: building elements, toasts and inline field errors.

import { ApiError } from "./api";
import { esc } from "./format";

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) el.append(c);
  return el;
}

export function html(strings: TemplateStringsArray, ...values: unknown[]): string {
  return strings.reduce((acc, s, i) => acc + s + (i < values.length ? esc(String(values[i])) : ""), "");
}

export function toast(message: string, kind: "info" | "error" = "info"): void {
  const box = document.getElementById("toasts");
  if (!box) return;
  const t = h("div", { class: `toast ${kind}`, role: kind === "error" ? "alert" : "status" }, message);
  box.append(t);
  setTimeout(() => t.remove(), kind === "error" ? 8000 : 4000);
}

/** Shows an API error next to the field it names, or at the top of the form. */
export function showFormError(form: HTMLFormElement, err: unknown): void {
  clearFormErrors(form);
  const message = err instanceof Error ? err.message : String(err);
  const param = err instanceof ApiError ? err.param : null;
  const field = param ? form.querySelector<HTMLElement>(`[data-field="${param}"]`) : null;
  const note = h("p", { class: "field-error", role: "alert" }, message);
  if (field) {
    field.classList.add("invalid");
    field.append(note);
  } else {
    form.prepend(note);
  }
}

export function clearFormErrors(form: HTMLFormElement): void {
  form.querySelectorAll(".field-error").forEach((e) => e.remove());
  form.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
}

export function stateBadge(state: string): string {
  return `<span class="badge state-${esc(state)}">${esc(state)}</span>`;
}

/**
 * Sets `parent`'s content to `markup`, keeping every node that stays the same.
 * A list redrawn at each streamed token must not replace the link or button
 * under the pointer: a press on one node and a release on its replacement is
 * no click at all, so a whole-list `innerHTML` loses clicks while a task runs.
 */
export function patchHtml(parent: Element, markup: string): void {
  const next = document.createElement("template");
  next.innerHTML = markup;
  patchChildren(parent, next.content);
}

function patchChildren(old: ParentNode & Node, next: ParentNode & Node): void {
  const want = Array.from(next.childNodes);
  want.forEach((n, i) => {
    const have = old.childNodes[i];
    if (!have) old.appendChild(n);
    else if (have.isEqualNode(n)) return;
    else if (sameShell(have, n)) {
      if (have.nodeType === Node.ELEMENT_NODE) patchChildren(have as Element, n as Element);
      else have.nodeValue = n.nodeValue;
    } else old.replaceChild(n, have);
  });
  while (old.childNodes.length > want.length) old.lastChild?.remove();
}

/** Same kind of node with the same attributes: only what is inside differs. */
function sameShell(a: Node, b: Node): boolean {
  if (a.nodeType !== b.nodeType || a.nodeName !== b.nodeName) return false;
  if (a.nodeType !== Node.ELEMENT_NODE) return true;
  const [x, y] = [a as Element, b as Element];
  if (x.attributes.length !== y.attributes.length) return false;
  return Array.from(y.attributes).every((attr) => x.getAttribute(attr.name) === attr.value);
}
