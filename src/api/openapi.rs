//! The native API's OpenAPI 3 description, served at `GET /api/v1/openapi.json`.
//!
//! The paths and bodies come from the handlers' `#[utoipa::path]` attributes and the request
//! and view types (`native::api()` registers routes and their description together, so the
//! spec lists every native route). Added here, from the tables the checks themselves read:
//! the error answers of each operation with their stable codes ([`ERRORS`]), and the ranges
//! of the numeric options (`validate::OPTIONS`).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use utoipa::OpenApi;

use super::validate::{MAX_URL_LEN, OPTIONS, OptionLimits, id_pattern};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idem",
        description = "idem's native API: TCC, saga and two-phase message transactions. \
                       See docs/api.md for the rules behind each field."
    ),
    components(schemas(idem_types::ErrorBody))
)]
struct Doc;

/// Error statuses and the codes each can carry.
type Statuses = &'static [(u16, &'static [&'static str])];

/// The codes every operation with a body or a gid can answer.
const BODY: [&str; 2] = ["invalid_json", "invalid_body"];
/// A database that is down or refuses the statement (docs/api.md, *Error codes*).
const DATABASE: [(u16, &[&str]); 2] = [(503, &["unavailable", "contention"]), (500, &["internal"])];
/// The tenant's request rate (`--rate-limit-per-second`), which every operation but the
/// document's can answer, with a `Retry-After`.
const RATE: [(u16, &[&str]); 1] = [(429, &["rate_limited"])];

/// What every operation but the description itself can answer: when tokens are required,
/// and from the checks against web pages (`same_origin`: another origin, a `Host` that is
/// not idem's).
const AUTH: [(u16, &[&str]); 2] = [
    (
        401,
        &[
            "token_missing",
            "token_malformed",
            "token_invalid",
            "token_revoked",
        ],
    ),
    (
        403,
        &["forbidden", "origin_not_allowed", "host_not_allowed"],
    ),
];
/// What every write (POST) can answer: a body that is not declared JSON.
const WRITE: [(u16, &[&str]); 1] = [(415, &["unsupported_media_type"])];

/// Per operation id: each error status it can answer and the codes under it.
pub const ERRORS: &[(&str, Statuses)] = &[
    (
        "create",
        &[
            (
                400,
                &[
                    "invalid_json",
                    "invalid_body",
                    "unknown_kind",
                    "empty_steps",
                    "invalid_gid",
                    "invalid_branch_id",
                    "invalid_url",
                    "url_not_allowed",
                    "too_long",
                    "invalid_text",
                    "invalid_header",
                    "invalid_options",
                    "option_limit",
                    "invalid_request",
                    "too_many_branches",
                    "payload_too_large",
                    "invalid_idempotency_key",
                    "idempotency_key_mismatch",
                ],
            ),
            (409, &["gid_conflict"]),
            (413, &["payload_too_large"]),
            (429, &["tenant_active_limit"]),
        ],
    ),
    ("list", &[(400, &["invalid_query"])]),
    ("show", &[(400, &["invalid_gid"]), (404, &["not_found"])]),
    (
        "attempts",
        &[
            (400, &["invalid_gid", "invalid_query"]),
            (404, &["not_found"]),
        ],
    ),
    (
        "register",
        &[
            (
                400,
                &[
                    "invalid_json",
                    "invalid_body",
                    "invalid_gid",
                    "invalid_branch_id",
                    "invalid_url",
                    "url_not_allowed",
                    "too_long",
                    "invalid_text",
                    "too_many_branches",
                    "payload_too_large",
                ],
            ),
            (404, &["not_found", "unknown_branch"]),
            (
                409,
                &[
                    "try_failed",
                    "branch_conflict",
                    "not_prepared",
                    "invalid_state",
                ],
            ),
            (413, &["payload_too_large"]),
            (425, &["try_in_progress"]),
            (502, &["try_unknown"]),
        ],
    ),
    ("submit", OPERATE),
    ("abort", OPERATE),
    ("retry", OPERATE),
    ("force_stop", OPERATE),
    (
        "bulk",
        &[(
            400,
            &[
                "invalid_json",
                "invalid_body",
                "invalid_operation",
                "invalid_status",
                "invalid_kind",
                "invalid_limit",
                "invalid_older_than",
                "too_long",
                "invalid_text",
            ],
        )],
    ),
    (
        "issue_token",
        &[(
            400,
            &[
                "invalid_json",
                "invalid_body",
                "invalid_role",
                "invalid_text",
            ],
        )],
    ),
    ("list_tokens", &[]),
    ("revoke_token", &[(404, &["not_found"])]),
    ("whoami", &[]),
    ("overview", &[(400, &["invalid_query"])]),
];

const OPERATE: Statuses = &[
    (
        400,
        &[
            "invalid_json",
            "invalid_body",
            "invalid_gid",
            "too_long",
            "invalid_text",
        ],
    ),
    (404, &["not_found"]),
    (
        409,
        &[
            "invalid_state",
            "timed_out",
            "try_failed",
            "try_not_succeeded",
        ],
    ),
    (413, &["payload_too_large"]),
];

/// The spec as served.
pub fn spec() -> Value {
    let (_, api) = utoipa_axum::router::OpenApiRouter::with_openapi(Doc::openapi())
        .merge(super::native::api())
        .split_for_parts();
    let mut spec = serde_json::to_value(api).expect("the spec serialises");
    spec["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    add_errors(&mut spec);
    add_option_ranges(&mut spec);
    add_id_and_url_rules(&mut spec);
    add_links(&mut spec);
    add_token_rules(&mut spec);
    // Optional: a coordinator without `--auth tokens` takes requests without one.
    spec["components"]["securitySchemes"] = json!({"bearer": {"type": "http", "scheme": "bearer"}});
    spec["security"] = json!([{}, {"bearer": []}]);
    spec
}

/// A created transaction's gid leads to the operations on it (OpenAPI links), so a client
/// generator or a stateful fuzzer can follow a create with them: every operation whose
/// path takes the `{gid}` parameter, read from the spec itself, so an operation without
/// one (the bulk actions) never gets a link that names a parameter it does not have.
fn add_links(spec: &mut Value) {
    let gid = json!({"gid": "$response.body#/gid"});
    let empty = serde_json::Map::new();
    let paths = spec["paths"].as_object().unwrap_or(&empty);
    let links: serde_json::Map<String, Value> = paths
        .iter()
        .filter(|(path, _)| path.contains("{gid}"))
        .flat_map(|(_, operations)| operations.as_object().into_iter().flatten())
        .filter_map(|(_, operation)| operation["operationId"].as_str())
        .map(|id| (id.to_owned(), json!({"operationId": id, "parameters": gid})))
        .collect();
    let create = &mut spec["paths"]["/api/v1/transactions"]["post"]["responses"];
    for status in ["200", "201"] {
        create[status]["links"] = Value::Object(links.clone());
    }
    // An issued token's id leads to its revocation.
    spec["paths"]["/api/v1/tokens"]["post"]["responses"]["201"]["links"] = json!({
        "revoke_token": {"operationId": "revoke_token", "parameters": {"id": "$response.body#/id"}}
    });
}

/// A token request's role is one of the three, its label as long as `issue` allows: the
/// handler parses a string so a wrong role gets its own code (`invalid_role`).
fn add_token_rules(spec: &mut Value) {
    let request = &mut spec["components"]["schemas"]["IssueRequest"]["properties"];
    request["role"]["enum"] = json!(["client", "operator", "admin"]);
    request["label"]["maxLength"] = json!(crate::auth::tokens::MAX_LABEL_LEN);
}

static SPEC: LazyLock<String> = LazyLock::new(|| spec().to_string());

#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    responses((status = 200, description = "This document", content_type = "application/json", body = Object))
)]
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], SPEC.as_str())
}

/// Every code the native API can answer, once each.
pub fn all_codes() -> Vec<&'static str> {
    let mut codes: Vec<&str> = ERRORS
        .iter()
        .flat_map(|(_, statuses)| {
            let common = DATABASE.iter().chain(&RATE).chain(&AUTH).chain(&WRITE);
            statuses.iter().chain(common)
        })
        .flat_map(|(_, codes)| codes.iter().copied())
        .chain(BODY)
        .collect();
    codes.sort_unstable();
    codes.dedup();
    codes
}

fn add_errors(spec: &mut Value) {
    spec["components"]["schemas"]["ErrorView"]["properties"]["code"]["enum"] = json!(all_codes());
    let error_body = json!({"$ref": "#/components/schemas/ErrorBody"});
    let Some(paths) = spec["paths"].as_object_mut() else {
        return;
    };
    for (method, operation) in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.iter_mut())
    {
        let id = operation["operationId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let Some((_, statuses)) = ERRORS.iter().find(|(op, _)| *op == id) else {
            continue;
        };
        // Their body is optional: an empty one is `{}`.
        if ["submit", "abort", "retry", "force_stop"].contains(&id.as_str()) {
            operation["requestBody"]["required"] = json!(false);
        }
        let write = if method == "post" { &WRITE[..] } else { &[] };
        let common = DATABASE.iter().chain(&RATE).chain(&AUTH).chain(write);
        for (status, codes) in statuses.iter().chain(common) {
            let list = codes
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let key = status.to_string();
            let responses = &mut operation["responses"];
            // A status the handler already answers with its own body (a Try's 409) takes
            // either body.
            let schema = match responses[&key]["content"]["application/json"]["schema"].take() {
                Value::Null => error_body.clone(),
                own => json!({"anyOf": [own, error_body]}),
            };
            let description = match responses[&key]["description"].as_str() {
                Some(own) => format!("{own}; or an error: {list}"),
                None => format!("An error: {list} (docs/api.md, *Error codes*)"),
            };
            responses[&key] = json!({
                "description": description,
                "content": {"application/json": {"schema": schema}},
            });
            if *status == 429 {
                responses[&key]["headers"] = json!({"Retry-After": {
                    "description": "Seconds until the tenant's next request would pass",
                    "schema": {"type": "integer", "minimum": 1},
                }});
            }
        }
    }
}

/// The rules of `validate::check_id` and `check_url`, written once from their bounds: the id
/// pattern on every `{gid}` path parameter, the `Idempotency-Key` header and the ids a request
/// names, the length cap on every participant URL.
fn add_id_and_url_rules(spec: &mut Value) {
    let pattern = json!(id_pattern());
    if let Some(paths) = spec["paths"].as_object_mut() {
        for operation in paths.values_mut().filter_map(Value::as_object_mut) {
            for op in operation.values_mut() {
                let params = op.get_mut("parameters").and_then(Value::as_array_mut);
                for param in params.into_iter().flatten() {
                    let gid_path = param["name"] == "gid" && param["in"] == "path";
                    let key_header = param["name"] == "Idempotency-Key" && param["in"] == "header";
                    if gid_path || key_header {
                        param["schema"]["pattern"] = pattern.clone();
                    }
                }
            }
        }
    }
    let schemas = &mut spec["components"]["schemas"];
    for (schema, field) in [
        ("CreateRequest", "gid"),
        ("BranchSpec", "branch_id"),
        ("RegisterRequest", "branch_id"),
    ] {
        let property = schemas
            .get_mut(schema)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(field))
            .expect("the request schemas name their ids");
        property["pattern"] = pattern.clone();
    }
    // Every participant URL a request names has check_url's bound.
    for schema in schemas
        .as_object_mut()
        .into_iter()
        .flat_map(|s| s.values_mut())
    {
        let properties = schema.get_mut("properties").and_then(Value::as_object_mut);
        for property in properties.into_iter().flat_map(|p| p.values_mut()) {
            if property["format"] == "uri" {
                property["maxLength"] = json!(MAX_URL_LEN);
            }
        }
    }
}

/// The table's ranges; an option the operator may bound more tightly says so, with the
/// default bound (the served document is the same for every server's settings).
fn add_option_ranges(spec: &mut Value) {
    let properties = &mut spec["components"]["schemas"]["OptionsRequest"]["properties"];
    let defaults = OptionLimits::default();
    for option in OPTIONS {
        let property = &mut properties[option.name];
        property["minimum"] = json!(option.min);
        property["maximum"] = json!(option.max);
        if let Some(limit) = &option.limit {
            let side = if limit.is_minimum { "least" } else { "most" };
            property["description"] = json!(format!(
                "The server allows at {side} its `{}` (default {}); past it `400 option_limit`.",
                limit.flag,
                (limit.of)(&defaults)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_of_the_spec_has_its_error_answers() {
        let spec = spec();
        let mut ids = Vec::new();
        for item in spec["paths"].as_object().unwrap().values() {
            for operation in item.as_object().unwrap().values() {
                let id = operation["operationId"].as_str().unwrap();
                ids.push(id.to_owned());
                if id == "openapi" {
                    continue;
                }
                let responses = operation["responses"].as_object().unwrap();
                for status in ["400", "401", "403", "429", "500", "503"] {
                    // Listing and revoking tokens and whoami read no body (an id that is
                    // no token's is a 404): no 400.
                    if status == "400" && ["list_tokens", "revoke_token", "whoami"].contains(&id) {
                        continue;
                    }
                    assert!(responses.contains_key(status), "{id} lacks {status}");
                }
            }
        }
        for (id, _) in ERRORS {
            assert!(ids.iter().any(|i| i == id), "{id} is not an operation");
        }
        // The create's header codes (schemathesis found one missing: an answer the spec
        // did not allow).
        for code in ["invalid_idempotency_key", "idempotency_key_mismatch"] {
            assert!(all_codes().contains(&code), "{code}");
        }
        let created = &spec["paths"]["/api/v1/transactions"]["post"]["responses"]["201"];
        assert_eq!(
            created["links"]["submit"]["operationId"], "submit",
            "{created}"
        );
        // Every link names an operation that takes the parameter it fills (schemathesis
        // refused the spec when one pointed at the bulk actions, which take no gid).
        let paths = spec["paths"].as_object().unwrap();
        for (name, link) in created["links"].as_object().unwrap() {
            let target = paths
                .iter()
                .find(|(_, ops)| {
                    ops.as_object()
                        .unwrap()
                        .values()
                        .any(|op| op["operationId"] == link["operationId"])
                })
                .unwrap_or_else(|| panic!("link {name} names no operation"));
            assert!(
                target.0.contains("{gid}"),
                "link {name} goes to {}",
                target.0
            );
        }
        assert!(created["links"].get("bulk").is_none(), "{created}");
        let abort = &spec["paths"]["/api/v1/transactions/{gid}/abort"]["post"];
        assert_eq!(abort["requestBody"]["required"], json!(false), "{abort}");
        let limited = &spec["paths"]["/api/v1/transactions"]["post"]["responses"]["429"];
        assert!(limited["headers"]["Retry-After"].is_object(), "{limited}");
        let codes = &spec["components"]["schemas"]["ErrorView"]["properties"]["code"]["enum"];
        for code in ["rate_limited", "payload_too_large"] {
            assert!(codes.as_array().unwrap().contains(&json!(code)), "{code}");
        }
        let max = &spec["components"]["schemas"]["OptionsRequest"]["properties"]["max_attempts"];
        assert_eq!(max["maximum"], json!(10_000), "{max}");
        // The server's own, tighter bound is named, with its default.
        let text = max["description"].as_str().unwrap_or_default();
        assert!(
            text.contains("--max-attempts-limit") && text.contains("100"),
            "{max}"
        );
        let attempts = &spec["paths"]["/api/v1/transactions/{gid}/attempts"]["get"];
        assert_eq!(attempts["operationId"], "attempts", "{attempts}");
        assert!(attempts["responses"]["404"].is_object(), "{attempts}");
    }

    #[test]
    fn ids_and_urls_carry_the_rules_validate_applies() {
        let spec = spec();
        let want = json!("^[A-Za-z0-9_.:-]{1,128}$");
        let mut gid_params = 0;
        for item in spec["paths"].as_object().unwrap().values() {
            for operation in item.as_object().unwrap().values() {
                for param in operation["parameters"].as_array().into_iter().flatten() {
                    if param["name"] == "gid" {
                        assert_eq!(param["schema"]["pattern"], want, "{param}");
                        gid_params += 1;
                    }
                }
            }
        }
        assert_eq!(gid_params, 7, "every operation on one transaction");
        let schemas = &spec["components"]["schemas"];
        assert_eq!(
            schemas["CreateRequest"]["properties"]["gid"]["pattern"],
            want
        );
        assert_eq!(
            schemas["BranchSpec"]["properties"]["branch_id"]["pattern"],
            want
        );
        assert_eq!(
            schemas["RegisterRequest"]["properties"]["branch_id"]["pattern"],
            want
        );
        // The pattern's bounds are check_id's: 128 characters pass, 129 do not.
        for id in ["a", "order-1:x_y.z", &"a".repeat(128)] {
            assert!(
                crate::api::validate::check_id("gid", "c", id).is_ok(),
                "{id}"
            );
        }
        for id in ["", "a b", "é", &"a".repeat(129)] {
            assert!(
                crate::api::validate::check_id("gid", "c", id).is_err(),
                "{id}"
            );
        }
    }
}
