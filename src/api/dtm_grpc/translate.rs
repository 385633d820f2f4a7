//! DTM's gRPC requests as the bodies of DTM's HTTP API: the gRPC door hands them to the
//! same routes (see the module above), so this is the whole of what is gRPC-specific about
//! a request. Pure functions, tested below.

use std::collections::BTreeMap;

use idem_dtm_proto::{DtmBranchRequest, DtmRequest};
use serde_json::{Map, Value, json};

/// Why a gRPC request has no HTTP body: answered `INVALID_ARGUMENT` with this code and
/// message, like the HTTP door's 400s.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: &'static str,
    pub message: String,
}

impl Refused {
    fn new(code: &'static str, message: impl Into<String>) -> Refused {
        Refused {
            code,
            message: message.into(),
        }
    }
}

/// A `DtmRequest` (Prepare, Submit, Abort) as DTM's `TransGlobal` JSON. Proto3 cannot tell
/// an absent number from zero, and DTM's server reads zero as "the default": so do these
/// bodies, by leaving zeros out. Negative numbers are passed on, for the shared checks to
/// refuse.
pub fn trans_body(request: &DtmRequest) -> Result<Value, Refused> {
    let mut body = Map::new();
    body.insert("gid".into(), json!(request.gid));
    body.insert("trans_type".into(), json!(request.trans_type));
    let steps = request.steps.trim();
    // DTM's Go client sends "null" (its marshalled nil slice) for TCC and XA.
    if !steps.is_empty() && steps != "null" {
        let parsed: Value = serde_json::from_str(steps)
            .map_err(|e| Refused::new("invalid_json", format!("Steps is not JSON: {e}")))?;
        body.insert("steps".into(), parsed);
    }
    if !request.bin_payloads.is_empty() {
        let payloads =
            request
                .bin_payloads
                .iter()
                .enumerate()
                .map(|(i, bytes)| {
                    String::from_utf8(bytes.clone()).map(Value::String).map_err(|_| {
                    Refused::new(
                        "binary_payload",
                        format!(
                            "BinPayloads[{i}] is not UTF-8 text; this version of idem stores \
                             payloads as text"
                        ),
                    )
                })
                })
                .collect::<Result<Vec<_>, _>>()?;
        body.insert("payloads".into(), Value::Array(payloads));
    }
    put_text(&mut body, "custom_data", &request.customed_data);
    put_text(&mut body, "query_prepared", &request.query_prepared);
    put_text(&mut body, "rollback_reason", &request.rollback_reason);
    if let Some(options) = &request.trans_options {
        if options.wait_result {
            body.insert("wait_result".into(), json!(true));
        }
        put_number(&mut body, "timeout_to_fail", options.timeout_to_fail);
        put_number(&mut body, "retry_interval", options.retry_interval);
        put_number(&mut body, "request_timeout", options.request_timeout);
        put_number(&mut body, "retry_limit", options.retry_limit);
        if !options.branch_headers.is_empty() {
            let headers: BTreeMap<_, _> = options.branch_headers.iter().collect();
            body.insert("branch_headers".into(), json!(headers));
        }
    }
    Ok(Value::Object(body))
}

/// A `DtmBranchRequest` as the body of DTM's `registerBranch`: its `Data` map (a TCC
/// branch's `confirm` and `cancel`) with the named fields over it, and `BusiPayload` as
/// `data`, what Confirm and Cancel receive.
pub fn branch_body(request: &DtmBranchRequest) -> Result<Value, Refused> {
    let mut body: Map<String, Value> = request
        .data
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    body.insert("gid".into(), json!(request.gid));
    body.insert("trans_type".into(), json!(request.trans_type));
    body.insert("branch_id".into(), json!(request.branch_id));
    if !request.op.is_empty() {
        body.insert("op".into(), json!(request.op));
    }
    let payload = String::from_utf8(request.busi_payload.clone()).map_err(|_| {
        Refused::new(
            "binary_payload",
            "BusiPayload is not UTF-8 text; this version of idem stores payloads as text",
        )
    })?;
    body.insert("data".into(), Value::String(payload));
    Ok(Value::Object(body))
}

fn put_text(body: &mut Map<String, Value>, key: &str, value: &str) {
    if !value.is_empty() {
        body.insert(key.into(), json!(value));
    }
}

fn put_number(body: &mut Map<String, Value>, key: &str, value: i64) {
    if value != 0 {
        body.insert(key.into(), json!(value));
    }
}

#[cfg(test)]
mod tests {
    use idem_dtm_proto::DtmTransOptions;

    use super::*;

    #[test]
    fn a_saga_request_becomes_dtms_trans_global() {
        let request = DtmRequest {
            gid: "g1".into(),
            trans_type: "saga".into(),
            trans_options: Some(DtmTransOptions {
                wait_result: true,
                timeout_to_fail: 0,
                retry_interval: 5,
                branch_headers: [("x-a".to_owned(), "1".to_owned())].into(),
                request_timeout: -1,
                retry_limit: 3,
            }),
            customed_data: r#"{"concurrent":false}"#.into(),
            bin_payloads: vec![b"{\"n\":1}".to_vec()],
            steps: r#"[{"action":"http://a/x","compensate":"http://a/y"}]"#.into(),
            ..DtmRequest::default()
        };
        let body = trans_body(&request).unwrap();
        assert_eq!(
            body,
            json!({
                "gid": "g1", "trans_type": "saga", "wait_result": true,
                "steps": [{"action": "http://a/x", "compensate": "http://a/y"}],
                "payloads": ["{\"n\":1}"], "custom_data": "{\"concurrent\":false}",
                "retry_interval": 5, "request_timeout": -1, "retry_limit": 3,
                "branch_headers": {"x-a": "1"},
            })
        );
    }

    #[test]
    fn go_clients_null_steps_and_absent_options_leave_the_defaults() {
        let request = DtmRequest {
            gid: "g".into(),
            trans_type: "tcc".into(),
            steps: "null".into(),
            ..DtmRequest::default()
        };
        assert_eq!(
            trans_body(&request).unwrap(),
            json!({"gid": "g", "trans_type": "tcc"})
        );
    }

    #[test]
    fn steps_that_are_not_json_and_binary_payloads_are_refused_with_codes() {
        let bad_steps = DtmRequest {
            steps: "[{".into(),
            ..DtmRequest::default()
        };
        assert_eq!(trans_body(&bad_steps).unwrap_err().code, "invalid_json");
        let binary = DtmRequest {
            bin_payloads: vec![vec![0xff, 0x00]],
            ..DtmRequest::default()
        };
        assert_eq!(trans_body(&binary).unwrap_err().code, "binary_payload");
        let binary_branch = DtmBranchRequest {
            busi_payload: vec![0xc3],
            ..DtmBranchRequest::default()
        };
        assert_eq!(
            branch_body(&binary_branch).unwrap_err().code,
            "binary_payload"
        );
    }

    #[test]
    fn a_branch_requests_named_fields_win_over_its_data_map() {
        let request = DtmBranchRequest {
            gid: "g".into(),
            trans_type: "tcc".into(),
            branch_id: "01".into(),
            op: "try".into(),
            data: [
                ("confirm".to_owned(), "http://p/confirm".to_owned()),
                ("gid".to_owned(), "other".to_owned()),
            ]
            .into(),
            busi_payload: b"{}".to_vec(),
        };
        assert_eq!(
            branch_body(&request).unwrap(),
            json!({
                "gid": "g", "trans_type": "tcc", "branch_id": "01", "op": "try",
                "confirm": "http://p/confirm", "data": "{}",
            })
        );
    }
}
