//! The client's errors. An answer of the API keeps its stable code; a failure without an
//! answer keeps what kind of failure it was.

use crate::{ErrorBody, cut};

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The coordinator answered with an error: its HTTP status, its stable code (see
    /// docs/api.md, *Error codes*: `gid_conflict`, `not_found`, `try_failed`,
    /// `unavailable`, ...) and its message. An error answer that is not the API's error
    /// body (a proxy's page, say) has the code `http_<status>` and the first 300 bytes of
    /// the body as its message.
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
    Transport(TransportError),
    /// A success status whose body is not what the API answers: something other than a
    /// coordinator may be listening there.
    #[error("unexpected answer (HTTP {status}): {message}: {body}")]
    Decode {
        /// The HTTP status (2xx).
        status: u16,
        /// Why the body did not parse.
        message: String,
        /// The first 300 bytes of the body.
        body: String,
    },
    /// The base URL given to the client does not parse.
    #[error("invalid URL {0}")]
    InvalidUrl(String),
}

/// A request that got no (whole) answer, with what kind of failure it was, so a caller can
/// tell "nothing is listening there" from "it did not answer in time".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    message: String,
    cause: String,
    timeout: bool,
    connect: bool,
    answer_status: Option<u16>,
}

impl TransportError {
    /// `answer_status`: the status of an answer whose body then broke off.
    pub(crate) fn of(e: &reqwest::Error, answer_status: Option<u16>) -> TransportError {
        // reqwest's own message ("error sending request for url ...") wraps the part a
        // person can act on ("Connection refused"): keep the whole chain, and that part.
        let mut message = e.to_string();
        let mut cause: &dyn std::error::Error = e;
        while let Some(source) = cause.source() {
            let text = source.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            cause = source;
        }
        TransportError {
            message,
            cause: cause.to_string(),
            timeout: e.is_timeout(),
            connect: e.is_connect(),
            answer_status,
        }
    }

    /// The innermost cause, e.g. `Connection refused (os error 111)`.
    pub fn cause(&self) -> &str {
        &self.cause
    }

    /// The request or the connection timed out.
    pub fn is_timeout(&self) -> bool {
        self.timeout
    }

    /// No connection could be made: nothing was sent.
    pub fn is_connect(&self) -> bool {
        self.connect
    }

    /// The answer's status came, but its body broke off: the coordinator got the request.
    pub fn while_reading_answer(&self) -> bool {
        self.answer_status.is_some()
    }

    /// The status of an answer whose body broke off.
    pub fn answer_status(&self) -> Option<u16> {
        self.answer_status
    }
}

impl From<&str> for TransportError {
    fn from(message: &str) -> TransportError {
        TransportError::from(message.to_owned())
    }
}

impl From<String> for TransportError {
    fn from(message: String) -> TransportError {
        TransportError {
            cause: message.clone(),
            message,
            timeout: false,
            connect: false,
            answer_status: None,
        }
    }
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

    /// An error answer in the API's own shape (`{"error": {"code", "message"}}`), as
    /// opposed to a page from something else in front of or instead of a coordinator.
    pub fn is_from_api(&self) -> bool {
        matches!(self, Error::Api { code, status, .. } if *code != format!("http_{status}"))
    }

    /// A failure after which the request may or may not have been applied, and which a
    /// repeat with the same gid may cure: no answer, the coordinator's database
    /// unavailable, or a gateway in front of it that got no answer (a 502 or 504 that is
    /// not the API's own); or one refused before it was read because the tenant was over
    /// its request rate (429). Everything else (a refusal, a conflict, a Try's own outcome)
    /// would answer the same again.
    pub fn may_succeed_on_retry(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Api { status, code, .. } => {
                matches!(status, 429 | 503)
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
        let e = Error::from_answer(429, r#"{"error":{"code":"rate_limited","message":"t"}}"#);
        assert!(e.may_succeed_on_retry(), "refused before it was read");
        let e = Error::from_answer(502, "<html>bad gateway</html>");
        assert_eq!(e.code(), Some("http_502"));
        assert!(e.may_succeed_on_retry(), "a gateway without an answer");
        let e = Error::from_answer(502, r#"{"error":{"code":"try_unknown","message":"?"}}"#);
        assert!(!e.may_succeed_on_retry(), "the Try's own outcome");
        assert!(Error::Transport("reset".into()).may_succeed_on_retry());
    }

    #[test]
    fn an_answer_in_the_apis_shape_is_told_from_another_servers_page() {
        let api = Error::from_answer(404, r#"{"error":{"code":"not_found","message":"no"}}"#);
        assert!(api.is_from_api());
        let page = Error::from_answer(404, "<html>Not Found</html>");
        assert!(!page.is_from_api());
        assert_eq!(
            page,
            Error::Api {
                status: 404,
                code: "http_404".into(),
                message: "<html>Not Found</html>".into()
            }
        );
        // An error body without a message is not the API's.
        assert!(!Error::from_answer(500, r#"{"error":{"code":"x"}}"#).is_from_api());
        assert!(!Error::Transport("reset".into()).is_from_api());
    }

    #[test]
    fn a_transport_error_made_from_text_is_of_no_particular_kind() {
        let e = TransportError::from("connection reset");
        assert_eq!(
            (e.cause(), e.to_string().as_str()),
            ("connection reset", "connection reset")
        );
        assert!(!e.is_timeout() && !e.is_connect() && !e.while_reading_answer());
    }
}
