// Elements are built, never parsed from strings: payloads, errors and reasons come from
// participants and clients and are shown as text only.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "testid") el.dataset.testid = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) el.setAttribute(k, v);
  append(el, children);
  return el;
}

export const $ = (id) => document.getElementById(id);

export function show(el, visible) {
  el.hidden = !visible;
}

export function time(ms) {
  if (ms == null) return "—";
  const d = new Date(ms);
  return h("time", { datetime: d.toISOString(), title: d.toISOString() }, d.toLocaleString());
}

export function ago(ms, now = Date.now()) {
  if (ms == null) return "—";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

export function badge(status) {
  return h("span", { class: `badge st-${status}`, testid: "status" }, status);
}

export const txHref = (gid) => `#/tx/${encodeURIComponent(gid)}`;

export function txLink(gid) {
  return h("a", { href: txHref(gid), class: "gid", testid: "tx-link" }, gid);
}

export function errorBox(e) {
  const code = e.code ? ` (${e.code})` : "";
  return h("p", { class: "error", role: "alert", testid: "error" }, `${e.message}${code}`);
}

export function table(headers, rows, attrs = {}) {
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      attrs,
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows),
    ),
  );
}
