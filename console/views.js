import { get, post, listPath, ApiError } from "./api.js";
import { h, time, ago, badge, txLink, errorBox, table } from "./dom.js";
import { throughputChart } from "./chart.js";
import { RANK } from "./detail.js";

const STATUSES = ["prepared", "running", "committing", "aborting", "stalled", "succeeded", "failed"];
const KINDS = ["tcc", "saga", "msg"];

function txRows(list, now) {
  return list.map((t) =>
    h(
      "tr",
      { testid: "tx-row", "data-gid": t.gid },
      h("td", {}, txLink(t.gid)),
      h("td", {}, t.kind),
      h("td", {}, badge(t.status), t.stalled_from ? h("small", {}, ` from ${t.stalled_from}`) : null),
      h("td", {}, time(t.created_at), h("small", { class: "muted" }, ` ${ago(t.created_at, now)}`)),
      h("td", { class: "num" }, t.attempts),
      h("td", { class: "clip" }, t.last_error || t.reason || ""),
    ),
  );
}

const TX_HEAD = ["gid", "kind", "status", "created", "failed calls", "last error"];

function txTable(list, now, id) {
  if (!list.length) return h("p", { class: "muted", id }, "None.");
  return table(TX_HEAD, txRows(list, now), { id });
}

export async function overview(view) {
  view.replaceChildren(h("h1", {}, "Overview"), h("p", { class: "muted" }, "Loading…"));
  let o = null;
  try {
    o = await get("/api/v1/overview?minutes=30");
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 404) throw e;
  }
  const parts = [h("h1", {}, "Overview")];
  if (!o) {
    // A coordinator without the overview route: the newest transactions are still useful.
    parts.push(h("p", { class: "notice", id: "overview-missing" }, "This coordinator has no overview; the newest transactions:"));
    const page = await get(listPath({ limit: 20 }));
    parts.push(txTable(page.transactions, Date.now(), "recent-table"));
    view.replaceChildren(...parts);
    return;
  }
  const counts = h(
    "div",
    { class: "counts", id: "counts" },
    STATUSES.map((st) =>
      h(
        "a",
        { class: `count st-${st}`, href: `#/list?status=${st}`, testid: `count-${st}` },
        h("strong", {}, o.counts[st] ?? 0),
        h("span", {}, st),
      ),
    ),
  );
  parts.push(counts);
  parts.push(
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Throughput, per minute"),
      h("p", { class: "legend" }, h("span", { class: "key created" }), " created ", h("span", { class: "key finished" }), " finished"),
      throughputChart(o.throughput || []),
    ),
  );
  parts.push(
    h("section", { class: "card" }, h("h2", {}, "Stalled, oldest first"), txTable(o.stalled || [], o.now, "stalled-table")),
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Oldest in progress"),
      txTable(o.oldest_in_progress || [], o.now, "oldest-table"),
    ),
  );
  const coords = o.coordinators || [];
  if (coords.length) {
    parts.push(
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Coordinators seen"),
        table(
          ["node", "last seen", "last claim"],
          coords.map((c) =>
            h(
              "tr",
              { testid: "coordinator" },
              h("td", {}, c.node),
              h("td", {}, ago(c.last_seen_at, o.now)),
              h("td", {}, c.last_claim_at == null ? "never" : ago(c.last_claim_at, o.now)),
            ),
          ),
          { id: "coordinators" },
        ),
      ),
    );
  }
  view.replaceChildren(...parts);
}

// datetime-local inputs hold local wall time; the API wants epoch milliseconds.
const toMs = (v) => (v ? String(new Date(v).getTime()) : "");
const fromMs = (v) => {
  if (!v) return "";
  const d = new Date(Number(v));
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
};

function select(id, label, options, value) {
  return h(
    "label",
    { for: id },
    label,
    h("select", { id, name: id }, h("option", { value: "" }, "any"), options.map((o) => h("option", { value: o, selected: o === value }, o))),
  );
}

// Operators' bulk actions on the list filtered by a status: a dry run first shows what
// would change, and only a confirmation runs the action, whose outcome for each transaction
// is shown. The API selects by status and kind within the caller's tenant, oldest first, at
// most BULK_LIMIT per call, and checks the operator role again.
const BULK_LIMIT = 100;
const UNFINISHED = STATUSES.filter((st) => !["succeeded", "failed"].includes(st));

// Each operation, the statuses it is offered for, and what it does, said before confirming.
const OPS = [
  { op: "retry", label: "Retry all", verb: "Retry", statuses: ["stalled"], reason: false,
    does: "Each one's stalled branches get fresh attempts, resuming the phase it stalled in; the decision already taken stays." },
  { op: "force_stop", label: "Force-stop all", verb: "Force-stop", statuses: UNFINISHED, reason: true,
    does: "Each one is marked failed at once and nothing more is called: what was applied stays applied, nothing is compensated." },
  { op: "abort", label: "Abort all", verb: "Abort", statuses: ["prepared"], reason: true,
    does: "What each one ran is compensated or cancelled, then it ends as failed." },
];
const opId = (spec) => `bulk-${spec.op.replace("_", "-")}`;

function request(spec, filters, dryRun, reason) {
  const body = { operation: spec.op, status: filters.status, limit: BULK_LIMIT, dry_run: dryRun };
  if (filters.kind) body.kind = filters.kind;
  if (reason) body.reason = reason;
  return body;
}

function failure(e) {
  // A coordinator older than the bulk route: the actions are still there one by one.
  if (e instanceof ApiError && (e.status === 404 || e.status === 405)) {
    return errorBox(new ApiError(e.status, "no_bulk", "This coordinator has no bulk actions; act on each transaction from its page."));
  }
  return errorBox(e);
}

function outcome(r) {
  if (r.error) return h("span", { class: "error" }, `refused: ${r.error.message} (${r.error.code})`);
  if (r.after) return ["→ ", badge(r.after)];
  return "";
}

function itemRows(results, testid) {
  return results.map((r) =>
    h(
      "tr",
      { testid, "data-gid": r.gid, "data-after": r.after || null, "data-error": r.error ? r.error.code : null },
      h("td", {}, txLink(r.gid)),
      h("td", {}, badge(r.before)),
      testid === "bulk-outcome" ? h("td", {}, outcome(r)) : null,
    ),
  );
}

// The bar above the list, or null when there is nothing to offer: only operators (and
// admins) act in bulk, and only on a list filtered by a status some operation applies to.
// `refresh` reloads the list once an action ran.
function bulkBar(who, filters, refresh) {
  if (!filters.status || (RANK[who.role] ?? 0) < RANK.operator) return null;
  const ops = OPS.filter((o) => o.statuses.includes(filters.status));
  if (!ops.length) return null;
  const what = `${filters.status}${filters.kind ? ` ${filters.kind}` : ""} transactions`;
  if (filters.created_from || filters.created_to) {
    // The API selects by age, not by these bounds: acting on more than the list shows is
    // never what the operator meant.
    return h(
      "section",
      { class: "card bulk", id: "bulk-bar", testid: "bulk-bar" },
      h("p", { class: "muted", id: "bulk-note" }, "Bulk actions select by status and kind only: clear the creation-time filters to use them."),
    );
  }
  const panel = h("div", { id: "bulk-panel", class: "bulk-panel", hidden: true });
  const buttons = ops.map((spec) =>
    h("button", { id: opId(spec), testid: opId(spec), type: "button", class: spec.op === "retry" ? "" : "danger", onclick: () => preview(spec) }, spec.label),
  );
  const busy = (on) => {
    for (const b of [...buttons, ...panel.querySelectorAll("button")]) b.disabled = on;
  };

  function showPanel(...children) {
    panel.replaceChildren(...children);
    panel.hidden = false;
  }

  async function preview(spec) {
    busy(true);
    showPanel(h("p", { class: "muted" }, `Selecting the ${what}…`));
    let dry;
    try {
      dry = await post("/api/v1/bulk", request(spec, filters, true));
    } catch (e) {
      showPanel(failure(e));
      return;
    } finally {
      busy(false);
    }
    const n = dry.results.length;
    const cancel = h("button", { id: "bulk-cancel", testid: "bulk-cancel", type: "button", class: "secondary", onclick: close }, n ? "Cancel" : "Close");
    if (!n) {
      showPanel(h("div", { id: "bulk-preview", testid: "bulk-preview" }, h("p", { id: "bulk-count" }, `No ${what} match now.`), h("div", { class: "buttons" }, cancel)));
      return;
    }
    const reason = spec.reason
      ? h("label", { for: "bulk-reason" }, "Reason (optional, kept with each transaction)", h("input", { id: "bulk-reason", type: "text", maxlength: 1024, autocomplete: "off" }))
      : null;
    const confirm = h(
      "button",
      { id: "bulk-confirm", testid: "bulk-confirm", type: "button", class: spec.op === "retry" ? "" : "danger", onclick: () => run(spec, reason && reason.querySelector("input").value.trim()) },
      `${spec.verb} ${n}`,
    );
    showPanel(
      h(
        "div",
        { id: "bulk-preview", testid: "bulk-preview" },
        h("h2", { id: "bulk-count" }, `${spec.verb} ${n} ${what}?`),
        dry.more ? h("p", { class: "notice", id: "bulk-more", testid: "bulk-more" }, `More match: this run takes the oldest ${n}; run it again for the next ones.`) : null,
        h("p", {}, spec.does),
        h("p", { class: "muted" }, "Confirming selects again: it acts on those that match then, which may differ from this list if transactions moved meanwhile."),
        table(["gid", "status"], itemRows(dry.results, "bulk-item"), { id: "bulk-items" }),
        reason,
        h("div", { class: "buttons" }, cancel, confirm),
      ),
    );
  }

  async function run(spec, reason) {
    busy(true);
    showPanel(h("p", { class: "muted" }, `${spec.verb}…`));
    let done;
    try {
      done = await post("/api/v1/bulk", request(spec, filters, false, reason));
    } catch (e) {
      showPanel(failure(e));
      return;
    } finally {
      busy(false);
    }
    const refused = done.results.filter((r) => r.error).length;
    showPanel(
      h(
        "div",
        { id: "bulk-result", testid: "bulk-result", role: "status" },
        h(
          "p",
          { id: "bulk-summary" },
          `${spec.verb}: ${done.results.length} selected, ${done.results.length - refused} done, ${refused} refused.`,
          done.more ? " More match: run it again for the next ones." : "",
        ),
        done.results.length ? table(["gid", "was", "outcome"], itemRows(done.results, "bulk-outcome"), { id: "bulk-outcomes" }) : null,
        h("div", { class: "buttons" }, h("button", { id: "bulk-close", testid: "bulk-close", type: "button", class: "secondary", onclick: close }, "Close")),
      ),
    );
    refresh();
  }

  function close() {
    panel.hidden = true;
    panel.replaceChildren();
  }

  return h(
    "section",
    { class: "card bulk", id: "bulk-bar", testid: "bulk-bar" },
    h(
      "div",
      { class: "actions" },
      h("span", { class: "muted" }, `All ${what}, oldest first, at most ${BULK_LIMIT} a run:`),
      buttons,
    ),
    panel,
  );
}

export async function list(view, params, navigate, who) {
  const filters = {
    status: params.get("status") || "",
    kind: params.get("kind") || "",
    created_from: params.get("created_from") || "",
    created_to: params.get("created_to") || "",
    // The page size stays in the address, so a shared link pages the same way.
    limit: params.get("limit") || "50",
  };
  const form = h(
    "form",
    { id: "filters", class: "filters" },
    select("f-status", "Status", STATUSES, filters.status),
    select("f-kind", "Kind", KINDS, filters.kind),
    h("label", { for: "f-from" }, "Created from", h("input", { id: "f-from", type: "datetime-local", value: fromMs(filters.created_from) })),
    h("label", { for: "f-to" }, "Created to", h("input", { id: "f-to", type: "datetime-local", value: fromMs(filters.created_to) })),
    h("button", { id: "f-apply", type: "submit" }, "Apply"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    const set = (k, v) => v && q.set(k, v);
    set("status", form.querySelector("#f-status").value);
    set("kind", form.querySelector("#f-kind").value);
    set("created_from", toMs(form.querySelector("#f-from").value));
    set("created_to", toMs(form.querySelector("#f-to").value));
    if (filters.limit !== "50") set("limit", filters.limit);
    navigate(`#/list${q.toString() ? `?${q}` : ""}`);
  });
  const body = h("tbody", { id: "tx-rows" });
  const more = h("button", { id: "more", type: "button", hidden: true }, "More");
  // A div: a failed page shows its error box inside, replaced by the next page's count.
  const status = h("div", { class: "muted", id: "list-status" }, "Loading…");
  let cursor = null;
  // Reloads from the first page after a bulk action, keeping the bar and its outcome.
  const reload = () => {
    body.replaceChildren();
    cursor = null;
    page();
  };
  view.replaceChildren(
    h("h1", {}, "Transactions"),
    form,
    bulkBar(who, filters, reload),
    h(
      "div",
      { class: "scroll" },
      h("table", { id: "tx-table" }, h("thead", {}, h("tr", {}, TX_HEAD.map((t) => h("th", { scope: "col" }, t)))), body),
    ),
    status,
    more,
  );
  async function page() {
    more.disabled = true;
    try {
      const p = await get(listPath(filters, cursor));
      body.append(...txRows(p.transactions, Date.now()));
      cursor = p.next_cursor || null;
      more.hidden = !cursor;
      status.textContent = body.children.length ? `${body.children.length} shown${cursor ? "" : ", no more"}` : "None match.";
    } catch (e) {
      status.replaceChildren(errorBox(e));
    } finally {
      more.disabled = false;
    }
  }
  more.addEventListener("click", page);
  await page();
}
