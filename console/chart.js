import { h, s } from "./dom.js";

// Created and finished per minute as two bar series. The SVG stretches to its box (bars
// only); its labels are HTML below it, so they stay readable on a phone.
export function throughputChart(points) {
  const W = 1000, H = 100;
  const max = Math.max(1, ...points.map((p) => Math.max(p.created, p.finished)));
  const slot = W / Math.max(1, points.length);
  const bar = Math.max(1, slot / 2 - 1);
  const height = (v) => (v / max) * (H - 2);
  const svg = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    preserveAspectRatio: "none",
    class: "chart",
    role: "img",
    "aria-label": "transactions created and finished per minute",
    id: "throughput-chart",
  });
  svg.append(s("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis" }));
  points.forEach((p, i) => {
    const x = i * slot;
    const g = s("g", {}, s("title", {}, `${hhmm(p.minute)}: ${p.created} created, ${p.finished} finished`));
    g.append(s("rect", { x, y: H - height(p.created), width: bar, height: height(p.created), class: "created" }));
    g.append(s("rect", { x: x + bar + 1, y: H - height(p.finished), width: bar, height: height(p.finished), class: "finished" }));
    svg.append(g);
  });
  const total = (k) => points.reduce((n, p) => n + p[k], 0);
  const axis = h(
    "div",
    { class: "chart-axis" },
    h("span", {}, points.length ? hhmm(points[0].minute) : ""),
    h("span", { class: "muted" }, `peak ${max}/min · ${total("created")} created, ${total("finished")} finished`),
    h("span", {}, points.length ? hhmm(points[points.length - 1].minute) : ""),
  );
  return h("div", { class: "chart-box" }, svg, axis);
}

function hhmm(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

// One row per call: where it started within the whole history and how long it took.
export function attemptBar(start, duration, from, span) {
  const W = 200, H = 12;
  const x = span > 0 ? ((start - from) / span) * W : 0;
  const w = span > 0 ? Math.max(2, (Math.max(duration, 0) / span) * W) : W;
  return s(
    "svg",
    { viewBox: `0 0 ${W} ${H}`, class: "callbar", preserveAspectRatio: "none", "aria-hidden": "true" },
    s("rect", { x: 0, y: 0, width: W, height: H, class: "track" }),
    s("rect", { x: Math.min(x, W - 2), y: 0, width: Math.min(w, W - Math.min(x, W - 2)), height: H, class: "span" }),
  );
}
