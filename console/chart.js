import { s } from "./dom.js";

// Created and finished per minute as two bar series; sized by viewBox so it scales with
// its container on any screen.
export function throughputChart(points) {
  const W = 600, H = 160, pad = 24;
  const max = Math.max(1, ...points.map((p) => Math.max(p.created, p.finished)));
  const slot = (W - pad * 2) / Math.max(1, points.length);
  const bar = Math.max(1, slot / 2 - 1);
  const y = (v) => H - pad - (v / max) * (H - pad * 2);
  const svg = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    class: "chart",
    role: "img",
    "aria-label": "transactions created and finished per minute",
    id: "throughput-chart",
  });
  svg.append(s("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, class: "axis" }));
  svg.append(s("text", { x: 2, y: pad, class: "tick" }, String(max)));
  svg.append(s("text", { x: 2, y: H - pad, class: "tick" }, "0"));
  points.forEach((p, i) => {
    const x = pad + i * slot;
    const label = `${new Date(p.minute).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}: ` +
      `${p.created} created, ${p.finished} finished`;
    const g = s("g", {}, s("title", {}, label));
    g.append(s("rect", { x, y: y(p.created), width: bar, height: H - pad - y(p.created), class: "created" }));
    g.append(s("rect", { x: x + bar + 1, y: y(p.finished), width: bar, height: H - pad - y(p.finished), class: "finished" }));
    svg.append(g);
  });
  if (points.length) {
    const last = points[points.length - 1];
    const fmt = (m) => new Date(m).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    svg.append(s("text", { x: pad, y: H - 6, class: "tick" }, fmt(points[0].minute)));
    svg.append(s("text", { x: W - pad, y: H - 6, class: "tick end" }, fmt(last.minute)));
  }
  return svg;
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
