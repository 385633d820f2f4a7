//! Rereading files without a restart: on SIGHUP and at an interval. The API's TLS
//! certificate and the signing keys both reload this way.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `reload` (given what triggered it: `"SIGHUP"` or `"interval"`) on every SIGHUP
/// and every `interval` (`None`: on SIGHUP only) until `stop`. SIGHUP is caught from this
/// call on, not from the first poll of the future: one sent as soon as the server says it
/// listens must not find the default action (the end of the process). `what` names the
/// files in the error logged when SIGHUP cannot be caught.
pub fn on_hangup_and_every(
    interval: Option<Duration>,
    stop: CancellationToken,
    what: &'static str,
    mut reload: impl FnMut(&'static str) + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut hangup = hangups(what);
    async move {
        loop {
            let why = tokio::select! {
                () = stop.cancelled() => return,
                () = next_hangup(&mut hangup) => "SIGHUP",
                () = tick(interval) => "interval",
            };
            reload(why);
        }
    }
}

async fn tick(interval: Option<Duration>) {
    match interval {
        Some(every) => tokio::time::sleep(every).await,
        None => std::future::pending().await,
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups(what: &'static str) -> Hangups {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP; {what} reload at their interval only");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangups(_: &'static str) -> Hangups {}

#[cfg(unix)]
async fn next_hangup(hangups: &mut Hangups) {
    if let Some(s) = hangups
        && s.recv().await.is_some()
    {
        return;
    }
    std::future::pending().await
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangups) {
    std::future::pending().await
}
