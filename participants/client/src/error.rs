//! The client's errors. An answer of the API keeps its stable code.

use crate::{ErrorBody, cut};

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The coordinator answered with an error: its HTTP status, its stable code (see
    /// docs/api.md, *Error codes*: `gid_conflict`, `not_found`, `try_failed`,
    /// `unavailable`, ...) and its message.
    #[error("{status} {code}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable, machine-readable code.
        code: String,
        /// For humans.
        message: String,
    },
    /// No answer: the connection failed or timed out. The request may have been applied.
    #[error("no answer from the coordinator: {0}")]
    Transport(String),
    /// An answer that is not what the API answers.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// The base URL given to the client does not parse.
    #[error("invalid URL {0}")]
    InvalidUrl(String),
}

impl Error {
    pub(crate) fn from_answer(status: u16, text: &str) -> Error {
        match serde_json::from_str::<ErrorBody>(text) {
            Ok(body) => Error::Api {
                status,
                code: body.error.code,
                message: body.error.message,
            },
            Err(_) => Error::Api {
                status,
                code: format!("http_{status}"),
                message: cut(text, 300).to_owned(),
            },
        }
    }

    /// The API's code, when the coordinator answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// A failure after which the request may or may not have been applied, and which a
    /// repeat with the same gid may cure: no answer, the coordinator's database
    /// unavailable, or a gateway in front of it that got no answer (a 502 or 504 that is
    /// not the API's own). Everything else (a refusal, a conflict, a Try's own outcome)
    /// would answer the same again.
    pub fn may_succeed_on_retry(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Api { status, code, .. } => {
                *status == 503
                    || code == "unavailable"
                    || (matches!(status, 502 | 504) && code.starts_with("http_"))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_answer_keeps_its_code_and_only_what_may_be_cured_is_retried() {
        let e = Error::from_answer(409, r#"{"error":{"code":"gid_conflict","message":"no"}}"#);
        assert_eq!(e.code(), Some("gid_conflict"));
        assert!(!e.may_succeed_on_retry());
        let e = Error::from_answer(503, r#"{"error":{"code":"unavailable","message":"db"}}"#);
        assert!(e.may_succeed_on_retry());
        let e = Error::from_answer(502, "<html>bad gateway</html>");
        assert_eq!(e.code(), Some("http_502"));
        assert!(e.may_succeed_on_retry(), "a gateway without an answer");
        let e = Error::from_answer(502, r#"{"error":{"code":"try_unknown","message":"?"}}"#);
        assert!(!e.may_succeed_on_retry(), "the Try's own outcome");
        assert!(Error::Transport("reset".into()).may_succeed_on_retry());
    }
}
