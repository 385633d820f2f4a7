import { get, post, txPath, consoleConfig } from "./api.js";
import { h, $, time, badge, errorBox, table } from "./dom.js";
import { attemptBar } from "./chart.js";

// The roles in order: each may do what the ones before it may.
export const RANK = { client: 0, operator: 1, admin: 2 };
const TERMINAL = ["succeeded", "failed"];

// What each action will and will not do, said before the operator confirms it.
const ACTIONS = {
  retry: {
    label: "Retry",
    role: "operator",
    title: "Retry this stalled transaction?",
    does: "Gives its stalled branches fresh attempts: the coordinator calls them again, resuming the phase it stalled in.",
    doesnt: "It does not change the decision already taken (commit or abort) and does not repeat calls that already succeeded.",
    when: (t) => t.status === "stalled",
  },
  "force-stop": {
    label: "Force-stop",
    role: "operator",
    title: "Force-stop this transaction?",
    does: "Marks it failed at once and calls nothing more: what was applied stays applied.",
    doesnt: "It does not compensate or cancel anything; participants keep whatever state they reached, to be fixed by hand.",
    when: (t) => !TERMINAL.includes(t.status),
  },
  abort: {
    label: "Abort",
    role: "client",
    title: "Abort this transaction?",
    does: "Compensates (saga) or cancels (TCC) the branches that ran, then ends it as failed.",
    doesnt: "It cannot undo a transaction already committing; the API refuses it then.",
    when: (t) => ["prepared", "running"].includes(t.status) || (t.status === "stalled" && t.stalled_from === "running"),
  },
};

function fields(t) {
  const o = t.options || {};
  const rows = [
    ["gid", t.gid],
    ["tenant", t.tenant],
    ["kind", t.kind],
    ["status", badge(t.status)],
    ["stalled from", t.stalled_from],
    ["reason", t.reason],
    ["last error", t.last_error],
    ["failed calls", t.attempts],
    ["created", time(t.created_at)],
    ["updated", time(t.updated_at)],
    ["finished", t.finished_at ? time(t.finished_at) : null],
    ["next attempt", t.next_attempt_at ? time(t.next_attempt_at) : null],
    ["timeout", t.timeout_at ? time(t.timeout_at) : null],
    ["options", options(o)],
  ];
  return h(
    "dl",
    { class: "fields", id: "tx-fields" },
    rows.filter(([, v]) => v != null && v !== "").map(([k, v]) => [h("dt", {}, k), h("dd", { testid: `field-${k.replace(/ /g, "-")}` }, v)]),
  );
}

function options(o) {
  const shown = Object.entries(o).filter(([, v]) => v !== null && !(typeof v === "object" && !Object.keys(v).length));
  if (!shown.length) return null;
  return h(
    "details",
    {},
    h("summary", {}, `${shown.length} settings`),
    h("ul", { class: "options" }, shown.map(([k, v]) => h("li", {}, h("span", { class: "muted" }, `${k} `), typeof v === "object" ? JSON.stringify(v) : String(v)))),
  );
}

function branches(t) {
  return table(
    ["branch", "operation", "status", "calls", "last error", "URL"],
    t.branches.map((b) =>
      h(
        "tr",
        { testid: "branch-row", "data-action": b.action },
        h("td", {}, b.branch_id),
        h("td", {}, b.action),
        h("td", {}, badge(b.status)),
        h("td", { class: "num" }, b.attempts),
        h("td", { class: "clip" }, b.last_error || ""),
        h("td", { class: "url" }, b.url),
      ),
    ),
    { id: "branches" },
  );
}

function payloads(t) {
  return h(
    "div",
    { id: "payloads" },
    t.branches.map((b) =>
      h(
        "details",
        { testid: "payload", open: true },
        // Bytes that are not text (from DTM's gRPC clients) arrive as base64: say so.
        h(
          "summary",
          {},
          `${b.branch_id} ${b.action}` +
            (b.payload_encoding === "base64" ? " · bytes, as base64" : ""),
        ),
        h("pre", {}, pretty(b.payload)),
      ),
    ),
  );
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// Calls are milliseconds apart: the time of day to the millisecond, the full date on hover.
function clock(ms) {
  const d = new Date(ms);
  const hms = d.toLocaleTimeString([], { hour12: false });
  return h("time", { datetime: d.toISOString(), title: d.toLocaleString() }, `${hms}.${String(d.getMilliseconds()).padStart(3, "0")}`);
}

function timeline(t) {
  const calls = t.history || [];
  if (!calls.length) return h("p", { class: "muted", id: "timeline" }, "Every call succeeded at once.");
  const from = Math.min(...calls.map((c) => c.started_at));
  const to = Math.max(...calls.map((c) => c.started_at + Math.max(0, c.duration_ms)));
  return h(
    "ol",
    { class: "timeline", id: "timeline" },
    calls.map((c) =>
      h(
        "li",
        { testid: "attempt", class: `outcome-${c.outcome}` },
        h("div", { class: "when" }, clock(c.started_at), h("small", { class: "muted" }, ` +${c.started_at - from} ms`)),
        h("div", { class: "what" }, `${c.branch_id} ${c.action} #${c.attempt}`),
        attemptBar(c.started_at, c.duration_ms, from, to - from),
        h("div", { class: "took" }, `${c.duration_ms} ms`),
        h("div", { class: "outcome", testid: "attempt-outcome" }, c.outcome),
        h("div", { class: "detail clip" }, c.detail || ""),
      ),
    ),
  );
}

function trace(t, config) {
  if (!t.trace_id) return null;
  const parts = [h("span", { class: "mono", id: "trace-id" }, t.trace_id)];
  if (config.trace_url) {
    const href = config.trace_url.replace("{trace_id}", encodeURIComponent(t.trace_id));
    // Only http(s) links: the pattern is the operator's, but a javascript: URL is never wanted.
    if (/^https?:\/\//i.test(href)) parts.push(" ", h("a", { id: "trace-link", href, target: "_blank", rel: "noopener" }, "open trace"));
  }
  return h("p", { class: "trace" }, "Trace ", parts);
}

function confirmAction(spec) {
  const dialog = $("confirm");
  $("confirm-title").textContent = spec.title;
  $("confirm-does").textContent = spec.does;
  $("confirm-doesnt").textContent = spec.doesnt;
  $("confirm-ok").textContent = spec.label;
  $("confirm-reason").value = "";
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? { reason: $("confirm-reason").value.trim() } : null),
      { once: true },
    );
  });
}

// Shows one transaction and keeps it current while it is still moving, so an action's
// outcome appears without reloading the page.
export async function detail(view, gid, who, isCurrent) {
  const config = await consoleConfig();
  let tx = await get(txPath(gid));
  const result = h("p", { id: "action-result", role: "status", hidden: true });
  const actions = h("div", { class: "actions", id: "actions" });
  const body = h("div", {});

  // The last action the API accepted: its line follows the transaction as it moves on.
  let done = null;

  function render() {
    if (done) result.textContent = `${done}: done. The transaction is now ${tx.status}.`;
    statusEl.replaceChildren(badge(tx.status));
    statusEl.dataset.status = tx.status;
    const allowed = Object.entries(ACTIONS).filter(
      ([, spec]) => RANK[who.role] >= RANK[spec.role] && spec.when(tx),
    );
    actions.replaceChildren(
      ...allowed.map(([op, spec]) =>
        h("button", { id: `action-${op}`, type: "button", class: op === "retry" ? "" : "danger", onclick: () => act(op, spec) }, spec.label),
      ),
    );
    body.replaceChildren(
      ...[fields(tx),
      trace(tx, config),
      h("h2", {}, "Branches"),
      branches(tx),
      h("h2", {}, "Calls that did not succeed at once"),
      timeline(tx),
      h("h2", {}, "Payloads"),
      payloads(tx)].filter(Boolean),
    );
  }

  async function act(op, spec) {
    const answer = await confirmAction(spec);
    if (!answer) return;
    result.hidden = false;
    result.textContent = `${spec.label}…`;
    try {
      tx = await post(txPath(gid, op), answer.reason ? { reason: answer.reason } : {});
      done = spec.label;
      render();
      follow(true);
    } catch (e) {
      done = null;
      result.replaceChildren(errorBox(e));
    }
  }

  let following = false;
  // After an action it keeps watching a while even through "stalled" (a retry may answer
  // before the transaction left it); otherwise a stalled one waits for the operator.
  async function follow(afterAction = false) {
    if (following) return;
    following = true;
    let ticks = afterAction ? 120 : Infinity;
    while (isCurrent() && !TERMINAL.includes(tx.status) && (afterAction || tx.status !== "stalled") && ticks-- > 0) {
      await new Promise((r) => setTimeout(r, 1000));
      if (!isCurrent()) break;
      try {
        tx = await get(txPath(gid));
        render();
      } catch {
        // A refresh that failed is tried again on the next tick.
      }
    }
    following = false;
  }

  const statusEl = h("span", { id: "tx-status" });
  view.replaceChildren(
    h("h1", { class: "gid-title" }, "Transaction ", h("span", { class: "mono", id: "tx-gid" }, gid)),
    h("p", {}, "Status ", statusEl),
    actions,
    result,
    body,
  );
  render();
  follow();
}
