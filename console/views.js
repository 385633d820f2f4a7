import { get, listPath, ApiError } from "./api.js";
import { h, time, ago, badge, txLink, errorBox, table } from "./dom.js";
import { throughputChart } from "./chart.js";

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

export async function list(view, params, navigate) {
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
  const status = h("p", { class: "muted", id: "list-status" }, "Loading…");
  view.replaceChildren(
    h("h1", {}, "Transactions"),
    form,
    h(
      "div",
      { class: "scroll" },
      h("table", { id: "tx-table" }, h("thead", {}, h("tr", {}, TX_HEAD.map((t) => h("th", { scope: "col" }, t)))), body),
    ),
    status,
    more,
  );
  let cursor = null;
  async function page() {
    more.disabled = true;
    try {
      const p = await get(listPath(filters, cursor));
      body.append(...txRows(p.transactions, Date.now()));
      cursor = p.next_cursor || null;
      more.hidden = !cursor;
      status.textContent = body.children.length ? `${body.children.length} shown${cursor ? "" : ", no more"}` : "None match.";
    } catch (e) {
      status.replaceWith(errorBox(e));
    } finally {
      more.disabled = false;
    }
  }
  more.addEventListener("click", page);
  await page();
}
