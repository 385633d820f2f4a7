//! The admin console's files, embedded in the binary from the repository's `console/` at
//! build time (no network, no Node.js), served at `/ui` without a token: they hold no
//! data; the console reads the API with the token its user types.
//!
//! Every answer forbids inline scripts and styles, framing and other origins
//! ([`CSP`]), and is revalidated on each load (`no-cache`), so an upgraded coordinator
//! serves its own console at once.
//!
//! The files: `index.html` (the shell and the confirmation dialog), `app.js` (sign-in,
//! routes, search), `api.js` (every call to the API, with the bearer token from session
//! storage), `views.js` (the overview and the list), `detail.js` (one transaction, its
//! timeline, the actions), `chart.js` (inline SVG charts), `dom.js` (building elements,
//! never HTML from data) and `app.css`. `/ui/config.json` carries `--console-trace-url`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::AppState;
use super::error::ApiError;

/// The console's files: every file of `console/` must be listed (a test checks).
pub const FILES: &[(&str, &[u8])] = &[
    ("index.html", include_bytes!("../../console/index.html")),
    ("app.js", include_bytes!("../../console/app.js")),
    ("app.css", include_bytes!("../../console/app.css")),
    ("api.js", include_bytes!("../../console/api.js")),
    ("chart.js", include_bytes!("../../console/chart.js")),
    ("detail.js", include_bytes!("../../console/detail.js")),
    ("dom.js", include_bytes!("../../console/dom.js")),
    ("views.js", include_bytes!("../../console/views.js")),
];

/// Only this origin's scripts, styles, images and API; nothing inline, no frames, no
/// plugins. docs/api.md (*Console*) says what it asks of the console's files.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'; form-action 'self'";

/// The console's settings that `idem serve` takes.
#[derive(Clone, Debug, Default)]
pub struct ConsoleConfig {
    /// A tracing UI's address of one trace, with `{trace_id}` where its id goes.
    pub trace_url: Option<String>,
}

/// Checks `--console-trace-url`: an http(s) URL with `{trace_id}` in it.
pub fn check_trace_url(pattern: &str) -> Result<String, String> {
    let scheme_ok = pattern.starts_with("https://") || pattern.starts_with("http://");
    if !scheme_ok || !pattern.contains("{trace_id}") {
        return Err(
            "expected an http(s) URL with {trace_id} where the trace id goes, \
             such as https://jaeger.example/trace/{trace_id}"
                .into(),
        );
    }
    Ok(pattern.to_owned())
}

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/config.json", get(config))
        .route("/ui/{*file}", get(file))
}

async fn index() -> Response {
    file(Path("index.html".to_owned())).await
}

async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _)| *n == name) {
        Some((name, body)) => answer(content_type(name), *body),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no file {name:?}"),
        )
        .into_response(),
    }
}

async fn config(State(app): State<Arc<AppState>>) -> Response {
    let body = json!({"trace_url": app.console.trace_url}).to_string();
    answer("application/json", body.into_bytes())
}

fn answer(content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    let mut response = (StatusCode::OK, body.into()).into_response();
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // The token stays in the tab; a link to the tracing UI tells it nothing either.
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map_or("", |(_, ext)| ext) {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_console_directory_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/console");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = FILES.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(listed, on_disk, "console/ and console::FILES differ");
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("app.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("README"), "application/octet-stream");
    }

    #[test]
    fn a_trace_url_pattern_is_http_with_the_id() {
        assert!(check_trace_url("https://jaeger.example/trace/{trace_id}").is_ok());
        assert!(check_trace_url("https://jaeger.example/trace/").is_err());
        assert!(check_trace_url("javascript:alert('{trace_id}')").is_err());
    }
}
