//! OTLP export of idem's spans (`--otlp-endpoint`): the `transaction` span of each drive
//! and the `branch_call` span of each call (see [`crate::trace`]), sent over OTLP/HTTP
//! with protobuf bodies by a batch processor on its own thread.
//!
//! Only spans of idem's own modules are exported: the exporter's HTTP client, sqlx and
//! hyper make spans too, and exporting the exporter's would feed on itself.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// The OTLP exporter while it runs. Dropping it sends what is still queued (bounded by the
/// exporter's timeout) and stops it.
pub struct Otlp {
    provider: SdkTracerProvider,
}

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason}")]
pub struct OtlpError {
    endpoint: String,
    reason: String,
}

impl Otlp {
    /// Starts exporting to `endpoint`, the collector's OTLP/HTTP base URL
    /// (`http://collector:4318`, as in `OTEL_EXPORTER_OTLP_ENDPOINT`): spans go to its
    /// `/v1/traces`. `None` when no endpoint is given. The batch's timing follows the
    /// standard `OTEL_BSP_*` variables.
    pub fn start(endpoint: Option<&str>) -> Result<Option<Otlp>, OtlpError> {
        let Some(endpoint) = endpoint.map(str::trim).filter(|e| !e.is_empty()) else {
            return Ok(None);
        };
        let url = traces_url(endpoint);
        let error = |reason: String| OtlpError {
            endpoint: url.clone(),
            reason,
        };
        let parsed = reqwest::Url::parse(&url).map_err(|e| error(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(error(
                "the endpoint must be an http:// or https:// URL".into(),
            ));
        }
        // The exporter's client is the workspace's reqwest, whose rustls needs the
        // process's provider before its first https connection.
        crate::tls::install_crypto_provider();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.as_str())
            .build()
            .map_err(|e| error(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name("idem").build())
            .build();
        Ok(Some(Otlp { provider }))
    }

    /// [`Otlp::start`] for a binary's `main`, before logging is set up: a bad endpoint
    /// ends the process with a message naming `program`.
    pub fn start_or_exit(endpoint: Option<&str>, program: &str) -> Option<Otlp> {
        Otlp::start(endpoint).unwrap_or_else(|e| {
            eprintln!("{program}: {e}");
            std::process::exit(1);
        })
    }

    /// The layer that turns idem's spans into exported ones.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer("idem");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(Targets::new().with_target("idem", tracing::Level::INFO))
    }
}

impl Drop for Otlp {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the trace exporter did not stop cleanly");
        }
    }
}

/// The signal's URL under a base URL; a URL that already names `/v1/traces` is kept.
fn traces_url(endpoint: &str) -> String {
    if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(traces_url("http://c/otlp"), "http://c/otlp/v1/traces");
    }

    #[test]
    fn a_bad_endpoint_is_an_error_and_none_is_nothing() {
        assert!(Otlp::start(None).unwrap().is_none());
        assert!(Otlp::start(Some(" ")).unwrap().is_none());
        assert!(Otlp::start(Some("ftp://c")).is_err());
        assert!(Otlp::start(Some("not a url")).is_err());
    }
}
