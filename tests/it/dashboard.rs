//! The Grafana dashboard `deploy/grafana/idem.json`: every series it queries is one a
//! running `idem serve` exports, and the file has the shape Grafana imports (panels with
//! targets, unique ids, the data source as a variable).
//!
//! A dashboard over a metric that was renamed or never existed imports without a word and
//! shows "No data" forever; an operator finds out in an outage. So the names are checked
//! against a real scrape, after traffic that makes the lazily registered series appear
//! (calls, a retry, a failure, HTTP requests, store writes), not against a list.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use common::recorder::Recorder;
use common::{Api, Child};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::{Value, json};

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/idem.json");

/// The suffixes Prometheus gives the series of a histogram (`_sum` and `_count` a
/// summary's too).
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel, those nested in a collapsed row included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every PromQL query the dashboard sends: its panels' targets and its query variables
/// (whose `query` is a string or, in newer Grafana, an object holding it).
fn queries(dashboard: &Value) -> Vec<String> {
    let targets = panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str());
    let variables = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .filter_map(|v| v["query"]["query"].as_str().or(v["query"].as_str()));
    targets.chain(variables).map(str::to_owned).collect()
}

/// The idem metric names an expression names, as written (a histogram's `_bucket` kept).
/// Quoted text (label values, regexes) is skipped: `job="idem_x"` names no metric.
fn metric_names(expr: &str) -> Vec<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let (mut quote, mut escaped) = (None, false);
    let mut previous = ' ';
    // Where the name being read ends: its characters are not looked at again.
    let mut skip_to = 0;
    for (i, c) in expr.char_indices() {
        if i < skip_to {
            previous = c;
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else if matches!(c, '"' | '\'' | '`') {
            quote = Some(c);
        } else if !is_name(previous) && expr[i..].starts_with("idem_") {
            let len = expr[i..]
                .find(|c: char| !is_name(c))
                .unwrap_or(expr.len() - i);
            names.push(expr[i..i + len].to_owned());
            skip_to = i + len;
        }
        previous = c;
    }
    names
}

/// What one scrape of `/metrics` exports: the names of its sample lines and the type of
/// each family (`# TYPE name type`).
struct Exposition {
    series: BTreeSet<String>,
    types: BTreeMap<String, String>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut series = BTreeSet::new();
        let mut types = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                    types.insert(name.to_owned(), kind.to_owned());
                }
            } else if !line.starts_with('#') {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                series.insert(line[..end].to_owned());
            }
        }
        Exposition { series, types }
    }

    /// Whether a query naming `name` finds series: a sample line of that name, or a family
    /// of that name whose type has such series (a histogram has `_bucket`, `_sum` and
    /// `_count` series and none of its bare name; a counter has no `_bucket`).
    fn exports(&self, name: &str) -> bool {
        if self.series.contains(name) {
            return true;
        }
        let suffixed = HISTOGRAM_SUFFIXES
            .iter()
            .find_map(|s| Some((name.strip_suffix(s)?, *s)));
        match suffixed {
            Some((family, suffix)) => match self.types.get(family).map(String::as_str) {
                Some("histogram") => true,
                Some("summary") => suffix != "_bucket",
                _ => false,
            },
            None => matches!(
                self.types.get(name).map(String::as_str),
                Some("counter" | "gauge")
            ),
        }
    }
}

/// The metric names in `exprs` that the exposition `text` does not export, each with the
/// first expression that names it. Names that do not start with `idem_` (`up`, Grafana's
/// `$__rate_interval`) are not idem's to export and are not looked at.
fn unexported(exprs: &[String], text: &str) -> Vec<(String, String)> {
    let exposition = Exposition::parse(text);
    let mut seen = HashSet::new();
    exprs
        .iter()
        .flat_map(|expr| metric_names(expr).into_iter().map(move |n| (n, expr)))
        .filter(|(name, _)| seen.insert(name.clone()) && !exposition.exports(name))
        .map(|(name, expr)| (name, expr.clone()))
        .collect()
}

/// What is wrong with the dashboard's shape, one line each.
fn shape_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |p: String| problems.push(p);
    for key in ["title", "uid"] {
        if dashboard[key].as_str().is_none_or(str::is_empty) {
            problem(format!("no {key}"));
        }
    }
    if dashboard["schemaVersion"].as_u64().is_none_or(|v| v < 36) {
        problem(format!("schemaVersion {}", dashboard["schemaVersion"]));
    }
    let variables = dashboard["templating"]["list"].as_array();
    let datasource = variables
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "datasource");
    if datasource.is_none_or(|v| v["type"] != "datasource" || v["query"] != "prometheus") {
        problem("no `datasource` variable of type datasource for prometheus".into());
    }
    // Every query goes to the chosen data source, never to one of the author's own uids.
    let uses_variable = |v: &Value| v["datasource"]["uid"] == "${datasource}";
    for v in variables
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
    {
        if !uses_variable(v) {
            problem(format!(
                "variable {} does not query ${{datasource}}",
                v["name"]
            ));
        }
    }
    let all = panels(dashboard);
    if all.iter().all(|p| p["type"] == "row") {
        problem("no panels".into());
    }
    let mut ids = HashSet::new();
    for panel in all {
        let title = panel["title"].as_str().unwrap_or_default();
        let Some(id) = panel["id"].as_u64() else {
            problem(format!("panel {title:?} has no numeric id"));
            continue;
        };
        let name = format!("panel {id} {title:?}");
        if !ids.insert(id) {
            problem(format!("{name}: its id is used twice"));
        }
        if title.is_empty() {
            problem(format!("{name}: no title"));
        }
        let grid = &panel["gridPos"];
        let at = |k: &str| grid[k].as_u64();
        match (at("x"), at("y"), at("w"), at("h")) {
            (Some(x), Some(_), Some(w), Some(h)) if w > 0 && h > 0 && x + w <= 24 => {}
            _ => problem(format!("{name}: gridPos {grid}")),
        }
        if panel["type"] == "row" {
            if panel.get("targets").is_some() {
                problem(format!("{name}: a row with targets"));
            }
            continue;
        }
        if !uses_variable(panel) {
            problem(format!("{name}: its datasource is not ${{datasource}}"));
        }
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if targets.is_empty() {
            problem(format!("{name}: no targets"));
        }
        let mut ref_ids = HashSet::new();
        for t in targets {
            let ref_id = t["refId"].as_str().unwrap_or_default();
            if ref_id.is_empty() || !ref_ids.insert(ref_id) {
                problem(format!(
                    "{name}: refId {:?} missing or repeated",
                    t["refId"]
                ));
            }
            if t["expr"].as_str().is_none_or(|e| e.trim().is_empty()) {
                problem(format!("{name}: target {ref_id:?} has no expr"));
            }
            if !uses_variable(t) {
                problem(format!(
                    "{name}: target {ref_id:?} is not on ${{datasource}}"
                ));
            }
        }
    }
    problems
}

fn saga_steps(p: &Recorder, tag: &str) -> Value {
    let step = |n: u32| {
        json!({"action": p.url(&format!("/{tag}/{n}/action")),
               "compensate": p.url(&format!("/{tag}/{n}/compensate")), "payload": {"n": n}})
    };
    json!([step(1), step(2)])
}

#[test]
fn the_dashboard_has_the_shape_grafana_imports() {
    let problems = shape_problems(&dashboard());
    assert!(problems.is_empty(), "{DASHBOARD}:\n{}", problems.join("\n"));
}

#[test]
fn a_bad_dashboard_shape_is_reported() {
    let bad = json!({
        "title": "t", "uid": "u", "schemaVersion": 39,
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [
            {"id": 1, "type": "row", "title": "r", "gridPos": {"x": 0, "y": 0, "w": 24, "h": 1}},
            {"id": 1, "type": "timeseries", "title": "a", "gridPos": {"x": 0, "y": 1, "w": 12, "h": 8},
             "datasource": {"uid": "${datasource}"},
             "targets": [{"refId": "A", "expr": " ", "datasource": {"uid": "${datasource}"}}]},
            {"id": 2, "type": "timeseries", "title": "b", "gridPos": {"x": 12, "y": 1, "w": 12, "h": 8},
             "datasource": {"uid": "mine"}, "targets": []},
        ],
    });
    let problems = shape_problems(&bad).join("\n");
    for expected in [
        "panel 1 \"a\": its id is used twice",
        "panel 1 \"a\": target \"A\" has no expr",
        "panel 2 \"b\": its datasource is not ${datasource}",
        "panel 2 \"b\": no targets",
    ] {
        assert!(problems.contains(expected), "{expected}:\n{problems}");
    }
}

/// Names in expressions, and the rules a scrape is read by: a histogram is queried through
/// its suffixed series only, a counter has no buckets.
#[test]
fn names_are_read_from_expressions_and_matched_by_their_type() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(idem_a_seconds_bucket{job=~"idem_x|y", i="\"idem_q"}[$__rate_interval]))) / idem_b_total + up"#;
    assert_eq!(
        metric_names(expr),
        ["idem_a_seconds_bucket", "idem_b_total"]
    );
    let text = "# TYPE idem_a_seconds histogram\n\
                idem_a_seconds_bucket{le=\"+Inf\"} 1\n\
                idem_a_seconds_sum 0.5\n\
                idem_a_seconds_count 1\n\
                # TYPE idem_b_total counter\n\
                idem_b_total{kind=\"saga\"} 3\n";
    let exprs = [
        expr,
        "idem_a_seconds_count + idem_a_seconds",
        "idem_b_total_bucket",
        "rate(idem_no_such_metric[5m])",
    ]
    .map(str::to_owned);
    let missing: Vec<String> = unexported(&exprs, text).into_iter().map(|m| m.0).collect();
    assert_eq!(
        missing,
        [
            "idem_a_seconds",
            "idem_b_total_bucket",
            "idem_no_such_metric"
        ]
    );
}

/// The other direction: a metric of the coordinator (docs/metrics.md's tables, but the
/// benchmark's SQL counters) on no panel is one an operator cannot see without writing a
/// query; a new metric gets a panel.
#[test]
fn the_dashboard_shows_every_described_metric() {
    let families: HashSet<String> = queries(&dashboard())
        .iter()
        .flat_map(|e| metric_names(e))
        .map(|n| {
            HISTOGRAM_SUFFIXES
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .map_or(n.clone(), str::to_owned)
        })
        .collect();
    // Retention describes its own counter, as it is registered only when retention is on.
    let described = idem::metrics::DESCRIPTIONS.iter().map(|d| d.0);
    let missing: Vec<&str> = described
        .chain([idem::retention::ROWS_DELETED])
        .filter(|name| !families.contains(*name))
        .collect();
    assert!(missing.is_empty(), "on no panel: {missing:?}");
}

#[tokio::test]
async fn every_series_the_dashboard_queries_is_exported_by_idem_serve() {
    let exprs = queries(&dashboard());
    assert!(!exprs.is_empty());
    let db = TestDatabase::create(Backend::Sqlite, "dashboard").await;
    let idem = Child::serve(&db.url, "dashboard", &[]).await;
    let api = Api::new(&idem.url);
    let p = Recorder::start().await;

    // A saga that succeeds after its first action is answered 500 once (a retry).
    p.answer("/ok/1/action", Some("dash-ok"), 1, 500);
    let body = json!({"gid": "dash-ok", "kind": "saga", "steps": saga_steps(&p, "ok"), "wait_result": true});
    let (code, tx) = api.post("/api/v1/transactions", body).await;
    assert_eq!(
        (code, tx["status"].as_str()),
        (201, Some("succeeded")),
        "{tx}"
    );
    // A saga whose second action fails: compensated, failed.
    p.answer("/fail/2/action", Some("dash-fail"), 1, 409);
    let body = json!({"gid": "dash-fail", "kind": "saga", "steps": saga_steps(&p, "fail"), "wait_result": true});
    let (code, tx) = api.post("/api/v1/transactions", body).await;
    assert_eq!((code, tx["status"].as_str()), (201, Some("failed")), "{tx}");
    // A TCC with one branch, confirmed.
    let branch = json!({"branch_id": "a", "confirm": p.url("/tcc/a/confirm"),
                        "cancel": p.url("/tcc/a/cancel"), "payload": {"branch": "a"}});
    let body = json!({"gid": "dash-tcc", "kind": "tcc", "branches": [branch]});
    assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);
    let submit = json!({"wait_result": true});
    let (code, tx) = api
        .post("/api/v1/transactions/dash-tcc/submit", submit)
        .await;
    assert_eq!(
        (code, tx["status"].as_str()),
        (200, Some("succeeded")),
        "{tx}"
    );

    // The sampled gauges come every few seconds (the recovery loop's lag after its first
    // pass): scrape until nothing is missing, or report what still is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let r = reqwest::get(format!("{}/metrics", idem.url)).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.unwrap();
        let missing = unexported(&exprs, &text);
        if missing.is_empty() {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{DASHBOARD} queries series `idem serve` does not export:\n{}\n\nlast scrape:\n{text}",
            missing
                .iter()
                .map(|(name, expr)| format!("  {name} in {expr}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The check itself, on the same scrape: a name idem does not export is reported.
    let fake = ["sum(rate(idem_no_such_metric[5m])) / sum(rate(idem_claims_total[5m]))".to_owned()];
    let missing = unexported(&fake, &text);
    assert_eq!(
        missing,
        [("idem_no_such_metric".to_owned(), fake[0].clone())]
    );

    drop(idem);
    db.drop_database().await;
}
