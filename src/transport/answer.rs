//! A participant's answer as the engine sees it: read up to a bound, classified by its
//! status (and DTM's markers), and kept out of the outcome's detail, which clients read.

use crate::core::{CallOutcome, Protocol};
use crate::outbound::redact_userinfo;

use super::CallRequest;

/// Bytes of an answer's body that the debug log shows.
const BODY_SNIPPET: usize = 300;

/// The first bytes of an answer's body, and whether there were more.
pub(super) struct Head {
    pub(super) text: String,
    cut: Option<usize>,
}

impl Head {
    pub(super) fn classify(&self, protocol: Protocol, status: u16) -> CallOutcome {
        let outcome = classify(protocol, status, &self.text);
        let Some(max) = self.cut else {
            return outcome;
        };
        let note = |detail: String| format!("{detail} (answer over {max} bytes, read no further)");
        match outcome {
            CallOutcome::Success => CallOutcome::Success,
            CallOutcome::Failure(d) => CallOutcome::Failure(note(d)),
            CallOutcome::InProgress(d) => CallOutcome::InProgress(note(d)),
            CallOutcome::Unknown(d) => CallOutcome::Unknown(note(d)),
        }
    }
}

/// Reads the body chunk by chunk and stops after `max` bytes: what is kept of an answer
/// is its status, DTM's marker and (in the debug log) a snippet, so the rest is never
/// buffered. Dropping the response with
/// body left unread closes that connection instead of returning it to the pool.
pub(super) async fn read_head(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Head, reqwest::Error> {
    let mut head = Vec::new();
    let mut cut = None;
    while let Some(chunk) = response.chunk().await? {
        let room = max - head.len();
        if chunk.len() > room {
            head.extend_from_slice(&chunk[..room]);
            cut = Some(max);
            break;
        }
        head.extend_from_slice(&chunk);
    }
    // A cut may split a character; the lossy decoding marks it rather than failing.
    let text = String::from_utf8_lossy(&head).into_owned();
    Ok(Head { text, cut })
}

/// A 3xx: the participant did not say whether it did the work, and its answer points
/// somewhere nobody registered. Unknown, so it is retried (and stalls or compensates once
/// the attempts are used up). Where it pointed is the participant's text: the debug log
/// has it, the detail (which clients read) does not.
pub(super) fn redirected(status: u16) -> CallOutcome {
    CallOutcome::Unknown(format!("HTTP {status}: redirect not followed"))
}

/// Reads a participant's answer. Native: by status code alone. DTM: a body that contains
/// `ONGOING` or `FAILURE` says so whatever the status (DTM clients rely on it); only the
/// head that was read (see [`super::DEFAULT_MAX_ANSWER_BYTES`]) is searched.
///
/// The detail is the status, and DTM's marker when the body had one, never the body: a
/// client chooses where idem calls, so an answer's text reflected into the client's views
/// would let it read whatever idem can reach.
pub fn classify(protocol: Protocol, status: u16, body: &str) -> CallOutcome {
    let marked = |marker: &str| {
        if body.contains(marker) {
            format!("HTTP {status}: {marker}")
        } else {
            format!("HTTP {status}")
        }
    };
    if protocol == Protocol::Dtm {
        if status == 425 || body.contains("ONGOING") {
            return CallOutcome::InProgress(marked("ONGOING"));
        }
        if status == 409 || body.contains("FAILURE") {
            return CallOutcome::Failure(marked("FAILURE"));
        }
    }
    match status {
        200..=299 => CallOutcome::Success,
        409 => CallOutcome::Failure("HTTP 409".into()),
        425 => CallOutcome::InProgress("HTTP 425".into()),
        _ => CallOutcome::Unknown(format!("HTTP {status}")),
    }
}

/// What the participant wrote (an answer's first bytes, a redirect's target), for the
/// operator's debug log only: bounded, userinfo redacted, control characters escaped.
pub(super) fn log_answer(request: &CallRequest, status: u16, what: &str, text: &str) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let shown = snippet(&redact_userinfo(text));
    tracing::debug!(
        tenant = request.tenant,
        gid = request.gid,
        branch_id = request.branch_id,
        op = request.action.op(),
        status,
        answer = ?shown,
        "the participant {what} this (not shown to clients)"
    );
}

/// The start of an answer, bounded. NULs are replaced (a log line should not carry one).
fn snippet(body: &str) -> String {
    let body = body.trim().replace('\0', "\u{FFFD}");
    if body.len() <= BODY_SNIPPET {
        return body;
    }
    let mut end = BODY_SNIPPET;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &body[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_reads_status_codes_only() {
        assert_eq!(
            classify(Protocol::Native, 200, "FAILURE"),
            CallOutcome::Success
        );
        assert_eq!(classify(Protocol::Native, 204, ""), CallOutcome::Success);
        assert!(matches!(
            classify(Protocol::Native, 409, "x"),
            CallOutcome::Failure(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 425, ""),
            CallOutcome::InProgress(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 500, ""),
            CallOutcome::Unknown(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 404, ""),
            CallOutcome::Unknown(_)
        ));
    }

    #[test]
    fn dtm_also_reads_the_body() {
        assert!(matches!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"FAILURE"}"#),
            CallOutcome::Failure(_)
        ));
        assert!(matches!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"ONGOING"}"#),
            CallOutcome::InProgress(_)
        ));
        assert!(matches!(
            classify(Protocol::Dtm, 500, "ONGOING"),
            CallOutcome::InProgress(_)
        ));
        assert_eq!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"SUCCESS"}"#),
            CallOutcome::Success
        );
    }

    #[test]
    fn a_redirect_is_unknown_and_keeps_its_target_out_of_the_detail() {
        let CallOutcome::Unknown(detail) = redirected(307) else {
            panic!("a redirect must be unknown");
        };
        assert_eq!(detail, "HTTP 307: redirect not followed");
    }

    #[test]
    fn details_carry_the_status_and_dtm_markers_never_the_body() {
        let secret = r#"{"error":"token_missing","key":"s3cret"}"#;
        for protocol in [Protocol::Native, Protocol::Dtm] {
            for status in [400, 401, 404, 409, 425, 500, 503] {
                let outcome = classify(protocol, status, secret);
                let detail = outcome.detail().unwrap_or_default();
                assert_eq!(detail, format!("HTTP {status}"), "{protocol:?}");
            }
        }
        let dtm = |status, body| classify(Protocol::Dtm, status, body);
        let failure = r#"{"dtm_result":"FAILURE","message":"card 4111 declined"}"#;
        assert_eq!(
            dtm(200, failure),
            CallOutcome::Failure("HTTP 200: FAILURE".into())
        );
        let ongoing = r#"{"dtm_result":"ONGOING","message":"s3cret"}"#;
        assert_eq!(
            dtm(500, ongoing),
            CallOutcome::InProgress("HTTP 500: ONGOING".into())
        );
    }

    #[test]
    fn a_cut_answer_says_so_and_is_classified_by_its_head() {
        let head = |text: &str, cut| Head {
            text: text.to_owned(),
            cut,
        };
        let outcome = head(r#"{"dtm_result":"FAILURE"}"#, Some(64)).classify(Protocol::Dtm, 200);
        let CallOutcome::Failure(detail) = outcome else {
            panic!("FAILURE in the head is a failure: {outcome:?}");
        };
        assert!(
            detail.ends_with("(answer over 64 bytes, read no further)"),
            "{detail}"
        );
        assert_eq!(
            head("x", Some(64)).classify(Protocol::Native, 204),
            CallOutcome::Success
        );
        let outcome = head("oops", None).classify(Protocol::Native, 500);
        assert_eq!(outcome, CallOutcome::Unknown("HTTP 500".into()));
    }

    #[test]
    fn snippets_carry_no_nul_and_stay_short() {
        assert_eq!(snippet("a\0b"), "a\u{FFFD}b");
        // The replacement is wider than a NUL: the cut comes after it.
        let s = snippet(&"\0".repeat(1_000));
        assert!(s.len() <= BODY_SNIPPET + "…".len(), "{}", s.len());
    }

    #[test]
    fn long_bodies_are_cut_on_a_char_boundary() {
        let body = "é".repeat(400);
        let s = snippet(&body);
        assert!(s.len() <= BODY_SNIPPET + "…".len());
        assert!(s.ends_with('…'));
    }
}
