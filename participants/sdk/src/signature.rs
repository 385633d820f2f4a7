//! Verifying that a call comes from your idem coordinator.
//!
//! A coordinator configured with a signing key (`idem serve --signing-secret-file PATH`)
//! signs every branch call with an `Idem-Signature` header:
//!
//! ```text
//! Idem-Signature: t=<unix seconds>,kid=<key id>,v1=<hex HMAC-SHA256>
//! ```
//!
//! over the canonical string (six lines joined by `\n`, no trailing newline):
//!
//! ```text
//! idem-signature-v1
//! <t>
//! <kid>
//! <METHOD>
//! <path and query as on the request line>
//! <lowercase hex SHA-256 of the body>
//! ```
//!
//! (see [`idem_signing`] for the details another language needs). A participant holds a
//! list of keys, `kid:secret` one per line (or comma-separated); it accepts a call signed
//! by any of them within a window (default [`DEFAULT_WINDOW`], 5 minutes, either way) of
//! its own clock. Rotation: add the new key to every participant's list, then make it the
//! coordinator's first key, then drop the old one from the lists.
//!
//! With axum, put [`require_signature`] in front of the branch routes: a call without a
//! valid signature gets `401` with `{"error": "<code>", "message": …}` (codes:
//! `signature_missing`, `signature_malformed`, `signature_unknown_key`,
//! `signature_mismatch`, `signature_expired`) and never reaches the handler. idem treats
//! a 401 like any unknown answer: it retries, and the transaction stalls (or a saga
//! compensates) once the attempts are used up, so fixing the keys lets it finish.
//!
//! ```no_run
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::post};
//! use idem_participant::signature::{Keys, Verifier, require_signature};
//!
//! let keys = Keys::from_file("/etc/shop/idem-keys".as_ref()).expect("signing keys");
//! let app: Router = Router::new()
//!     .route("/inventory/reserve", post(|| async { "ok" }))
//!     .layer(axum::middleware::from_fn_with_state(Verifier::new(keys), require_signature));
//! # }
//! ```
//!
//! Other frameworks call [`verify`] with the header's value, the method, the path and
//! query as received, the body, the time and the keys.

pub use idem_signing::{
    DEFAULT_WINDOW, HEADER, Key, KeyError, Keys, SignatureError, canonical, sign, unix_seconds,
    verify,
};

#[cfg(feature = "axum")]
pub use self::axum_layer::{SignatureRejection, SignedBy, Verifier, require_signature};

#[cfg(feature = "axum")]
mod axum_layer {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use axum::body::Body;
    use axum::extract::{OriginalUri, Request, State};
    use axum::http::request::Parts;
    use axum::http::{StatusCode, header};
    use axum::middleware::Next;
    use axum::response::{IntoResponse, Response};
    use serde_json::json;

    use super::{HEADER, Keys, SignatureError, verify};

    /// The bytes of a body read to check its signature, by default: idem's API takes
    /// requests of 1 MiB, so no registered payload is longer.
    const DEFAULT_MAX_BODY: usize = 2 << 20;

    /// What [`require_signature`] checks against: the keys, the window and how much of a
    /// body it reads. Cheap to clone.
    #[derive(Clone, Debug)]
    pub struct Verifier {
        keys: Arc<Keys>,
        window: Duration,
        max_body: usize,
    }

    impl Verifier {
        /// Accepts calls signed by any of `keys` within [`super::DEFAULT_WINDOW`].
        pub fn new(keys: Keys) -> Verifier {
            Verifier {
                keys: Arc::new(keys),
                window: super::DEFAULT_WINDOW,
                max_body: DEFAULT_MAX_BODY,
            }
        }

        /// How far a call's timestamp may be from this host's clock, either way.
        pub fn window(mut self, window: Duration) -> Verifier {
            self.window = window;
            self
        }

        /// The longest body read (a longer one is refused with 413 `body_too_large`).
        pub fn max_body_bytes(mut self, max: usize) -> Verifier {
            self.max_body = max;
            self
        }

        /// Checks a request's head and body; returns the key id that signed it. The path
        /// is the one on the request line, also under a nested router.
        pub fn verify_parts<'a>(
            &'a self,
            parts: &Parts,
            body: &[u8],
        ) -> Result<&'a str, SignatureError> {
            let mut values = parts.headers.get_all(HEADER).iter();
            let header = match (values.next(), values.next()) {
                (None, _) => None,
                (Some(_), Some(_)) => {
                    return Err(SignatureError::Malformed("more than one Idem-Signature"));
                }
                (Some(v), None) => Some(
                    v.to_str()
                        .map_err(|_| SignatureError::Malformed("not visible ASCII"))?,
                ),
            };
            let uri = parts
                .extensions
                .get::<OriginalUri>()
                .map_or(&parts.uri, |o| &o.0);
            let target = uri.path_and_query().map_or("/", |p| p.as_str());
            verify(
                header,
                parts.method.as_str(),
                target,
                body,
                SystemTime::now(),
                &self.keys,
                self.window,
            )
        }
    }

    /// Which key signed the call: put in the request's extensions by
    /// [`require_signature`] (`Extension<SignedBy>` in a handler).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct SignedBy(pub String);

    /// A refused signature as a response: 401 with the error's stable code.
    #[derive(Debug)]
    pub struct SignatureRejection(pub SignatureError);

    impl IntoResponse for SignatureRejection {
        fn into_response(self) -> Response {
            let body = json!({"error": self.0.code(), "message": self.0.to_string()});
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Idem-Signature")],
                axum::Json(body),
            )
                .into_response()
        }
    }

    /// axum middleware (`axum::middleware::from_fn_with_state(verifier,
    /// require_signature)`): reads the body (up to the verifier's bound), checks the
    /// signature, and passes the request on with the same body, or answers 401.
    pub async fn require_signature(
        State(verifier): State<Verifier>,
        request: Request,
        next: Next,
    ) -> Response {
        let (mut parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, verifier.max_body).await else {
            let body = json!({"error": "body_too_large", "message": format!("a signed body is read up to {} bytes", verifier.max_body)});
            return (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response();
        };
        let kid = match verifier.verify_parts(&parts, &bytes) {
            Ok(kid) => kid.to_owned(),
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "refused an unsigned or badly signed call");
                return SignatureRejection(e).into_response();
            }
        };
        parts.extensions.insert(SignedBy(kid));
        next.run(Request::from_parts(parts, Body::from(bytes)))
            .await
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests;
