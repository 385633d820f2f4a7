//! DTM's gRPC requests as the bodies of DTM's HTTP API: the gRPC door hands them to the
//! same routes (see the module above), so this is the whole of what is gRPC-specific about
//! a request. Pure functions, tested below.

use std::collections::BTreeMap;

use idem_dtm_proto::{DtmBranchRequest, DtmRequest};
use serde_json::{Map, Value, json};

use crate::api::dtm::BinaryPayloads;
use crate::core::Payload;

/// A gRPC request as a route of the DTM door takes it: DTM's JSON body, and the payloads
/// as the bytes they are (JSON has no bytes; the route reads them from a request
/// extension, see [`BinaryPayloads`]).
#[derive(Debug)]
pub struct DoorRequest {
    pub body: Value,
    pub payloads: Option<BinaryPayloads>,
}

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

/// A `DtmRequest` (Prepare, Submit, Abort) as DTM's `TransGlobal` JSON, its `BinPayloads`
/// as bytes. Proto3 cannot tell an absent number from zero, and DTM's server reads zero as
/// "the default": so do these bodies, by leaving zeros out. Negative numbers are passed
/// on, for the shared checks to refuse.
pub fn trans_body(request: &DtmRequest) -> Result<DoorRequest, Refused> {
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
    // The payloads stand for `payloads`; none is a TCC's (or a client's that has none).
    let payloads = (!request.bin_payloads.is_empty()).then(|| {
        BinaryPayloads(
            request
                .bin_payloads
                .iter()
                .map(|bytes| Payload::from(bytes.as_slice()))
                .collect(),
        )
    });
    Ok(DoorRequest {
        body: Value::Object(body),
        payloads,
    })
}

/// A `DtmBranchRequest` as the body of DTM's `registerBranch`: its `Data` map (a TCC
/// branch's `confirm` and `cancel`) with the named fields over it, and `BusiPayload`, what
/// Confirm and Cancel receive, as bytes (standing for the HTTP door's `data`).
pub fn branch_body(request: &DtmBranchRequest) -> DoorRequest {
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
    body.remove("data");
    DoorRequest {
        body: Value::Object(body),
        payloads: Some(BinaryPayloads(vec![Payload::from(
            request.busi_payload.as_slice(),
        )])),
    }
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
            bin_payloads: vec![b"{\"n\":1}".to_vec(), vec![0x08, 0xff, 0x00]],
            steps: r#"[{"action":"http://a/x","compensate":"http://a/y"}]"#.into(),
            ..DtmRequest::default()
        };
        let door = trans_body(&request).unwrap();
        // The payloads go as the bytes they are, text or not.
        assert_eq!(
            door.payloads.unwrap().0,
            [
                Payload::from("{\"n\":1}"),
                Payload::from(vec![0x08, 0xff, 0x00])
            ]
        );
        assert_eq!(
            door.body,
            json!({
                "gid": "g1", "trans_type": "saga", "wait_result": true,
                "steps": [{"action": "http://a/x", "compensate": "http://a/y"}],
                "custom_data": "{\"concurrent\":false}",
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
        let door = trans_body(&request).unwrap();
        assert_eq!(door.body, json!({"gid": "g", "trans_type": "tcc"}));
        assert!(door.payloads.is_none());
    }

    #[test]
    fn steps_that_are_not_json_are_refused_with_a_code() {
        let bad_steps = DtmRequest {
            steps: "[{".into(),
            ..DtmRequest::default()
        };
        assert_eq!(trans_body(&bad_steps).unwrap_err().code, "invalid_json");
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
                ("data".to_owned(), "not the payload".to_owned()),
            ]
            .into(),
            busi_payload: vec![0x0a, 0x80],
        };
        let door = branch_body(&request);
        assert_eq!(
            door.body,
            json!({
                "gid": "g", "trans_type": "tcc", "branch_id": "01", "op": "try",
                "confirm": "http://p/confirm",
            })
        );
        assert_eq!(door.payloads.unwrap().0, [Payload::from(vec![0x0a, 0x80])]);
    }
}
