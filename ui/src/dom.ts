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
