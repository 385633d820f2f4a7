//! TLS on real `idem serve` processes, with certificates made at test time (see
//! [`pki`]): the API over HTTPS, its certificate reloaded on SIGHUP (new connections get
//! the new one, open ones go on, a broken replacement keeps the old one and is logged at
//! error level) and at its interval, a silent connection closed by the read timeout, half
//! a pair refused at start; and calls to a participant that requires a client
//! certificate, which succeed with the CA bundle and the client certificate and fail
//! without either.
//!
//! Storage plays no part in any of this: every test runs on SQLite only.

use crate::common;
mod pki;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::Child;
use common::recorder::Recorder;
use common::typed::{self, created, wait_status};
use idem_client::{Action, Status};
use idem_participant::testing::{Backend, TestDatabase};
use pki::{Ca, Leaf, Usage, scratch};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const WAIT: Duration = Duration::from_secs(30);

/// A test's SQLite database, scratch directory and CA.
async fn setup(test: &str) -> (TestDatabase, PathBuf, Ca) {
    let db = TestDatabase::create(Backend::Sqlite, test).await;
    (db, scratch(test), Ca::new("idem test CA"))
}

fn addr(idem: &Child) -> SocketAddr {
    let url = idem.url.trim_start_matches("https://");
    url.trim_start_matches("http://").parse().unwrap()
}

/// An HTTPS client that trusts `ca` alone.
fn https_client(ca: &Ca) -> reqwest::Client {
    idem::transport::install_crypto_provider();
    let root = reqwest::Certificate::from_der(&ca.der()).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([root])
        .timeout(WAIT)
        .build()
        .unwrap()
}

/// `GET /health/live` over HTTPS, trusting `ca`; the status code.
async fn live(idem: &Child, ca: &Ca) -> u16 {
    let url = format!("{}/health/live", idem.url);
    let answer = https_client(ca).get(url).send().await.unwrap();
    answer.status().as_u16()
}

/// A new TLS connection to `addr` as `localhost`, trusting `ca`.
async fn tls_connect(addr: SocketAddr, ca: &Ca) -> TlsStream<TcpStream> {
    idem::transport::install_crypto_provider();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// The certificate a new connection to `addr` is served.
async fn served(addr: SocketAddr, ca: &Ca) -> CertificateDer<'static> {
    let stream = tls_connect(addr, ca).await;
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// `GET /health/live` on an open connection; returns the status line.
async fn live_on(stream: &mut TlsStream<TcpStream>) -> String {
    let answer = common::exchange(
        stream,
        b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    answer.lines().next().unwrap().to_owned()
}

/// Polls `check` until it gives a value, up to [`WAIT`].
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(done) = check().await {
            return done;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many lines of `log` say `text`.
fn logged(log: &Path, text: &str) -> usize {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    log.lines().filter(|l| l.contains(text)).count()
}

/// `idem serve` over HTTPS with `extra` flags and `leaf` as its certificate, written to
/// `dir/server.crt` and `dir/server.key`; its log goes to `dir/idem.log`.
async fn serve_https(db: &TestDatabase, dir: &Path, leaf: &Leaf, extra: &[&str]) -> Child {
    let (cert, key) = leaf.write(dir, "server");
    let mut args = vec![
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    args.extend(extra);
    Child::serve_logged(&db.url, &args, &dir.join("idem.log")).await
}

const RELOAD_FAILED: &str = "cannot reload the TLS certificate";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https_and_reloads_its_certificate_on_sighup() {
    let (db, dir, ca) = setup("tls_serves_and_reloads").await;
    let first = ca.issue("idem-first", Usage::Server);
    let idem = serve_https(&db, &dir, &first, &["--tls-reload-interval-ms", "0"]).await;
    let (cert, key, log) = (
        dir.join("server.crt"),
        dir.join("server.key"),
        dir.join("idem.log"),
    );
    assert!(idem.url.starts_with("https://"), "{}", idem.url);
    let addr = addr(&idem);

    assert_eq!(live(&idem, &ca).await, 200);
    let plain = reqwest::Client::new()
        .get(format!("http://{addr}/health/live"))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    assert_eq!(served(addr, &ca).await, first.der);
    let mut open = tls_connect(addr, &ca).await;
    assert_eq!(live_on(&mut open).await, "HTTP/1.1 200 OK");

    // A renewal half done: the new certificate with the old key.
    let second = ca.issue("idem-second", Usage::Server);
    std::fs::write(&cert, &second.cert_pem).unwrap();
    idem.signal("HUP");
    eventually("the failed reload is logged", async || {
        (logged(&log, RELOAD_FAILED) == 1).then_some(())
    })
    .await;
    let line = std::fs::read_to_string(&log).unwrap();
    let line = line.lines().find(|l| l.contains(RELOAD_FAILED)).unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert_eq!(served(addr, &ca).await, first.der, "the old one stays");

    std::fs::write(&key, &second.key_pem).unwrap();
    idem.signal("HUP");
    eventually("new connections get the new certificate", async || {
        (served(addr, &ca).await == second.der).then_some(())
    })
    .await;
    // The connection opened before the reloads goes on with its session.
    assert_eq!(live_on(&mut open).await, "HTTP/1.1 200 OK");
    assert_eq!(open.get_ref().1.peer_certificates().unwrap()[0], first.der);
    assert_eq!(logged(&log, RELOAD_FAILED), 1);
    drop(idem);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_at_its_interval_without_a_signal() {
    let (db, dir, ca) = setup("tls_reload_interval").await;
    let first = ca.issue("idem-first", Usage::Server);
    let idem = serve_https(&db, &dir, &first, &["--tls-reload-interval-ms", "100"]).await;
    let addr = addr(&idem);
    assert_eq!(served(addr, &ca).await, first.der);

    // A reload between the two writes fails and keeps the first; a later one takes both.
    let second = ca.issue("idem-second", Usage::Server);
    second.write(&dir, "server");
    eventually("the next reload serves the new certificate", async || {
        (served(addr, &ca).await == second.der).then_some(())
    })
    .await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_says_hello_is_closed_by_the_read_timeout() {
    let (db, dir, ca) = setup("tls_silent_connection").await;
    // One slot: the HTTPS request below gets it only once the silent connection is gone.
    let limits = [
        "--max-http-connections",
        "1",
        "--request-read-timeout-ms",
        "300",
    ];
    let idem = serve_https(&db, &dir, &ca.issue("idem", Usage::Server), &limits).await;
    let mut silent = TcpStream::connect(addr(&idem)).await.unwrap();

    assert_eq!(live(&idem, &ca).await, 200);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(WAIT, silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection is still open: {read:?}"
    );
    drop(idem);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_certificate_files_fail_the_start() {
    let (db, dir, ca) = setup("tls_bad_start").await;
    let (cert, _) = ca.issue("one", Usage::Server).write(&dir, "one");
    let (_, other_key) = ca.issue("two", Usage::Server).write(&dir, "two");
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ];
        args.extend(extra);
        let out = common::idem_run(&args, &[]);
        assert!(!out.status.success(), "idem {args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cert = cert.to_str().unwrap();
    let other_key = other_key.to_str().unwrap();
    let stderr = serve(&["--tls-cert", cert]);
    assert!(
        stderr.contains("--tls-cert needs --tls-key too"),
        "{stderr}"
    );
    let stderr = serve(&["--tls-key", other_key]);
    assert!(
        stderr.contains("--tls-key needs --tls-cert too"),
        "{stderr}"
    );
    let stderr = serve(&["--tls-cert", cert, "--tls-key", other_key]);
    assert!(stderr.contains(other_key), "{stderr}");
    let stderr = serve(&["--outbound-client-key", other_key]);
    assert!(
        stderr.contains("--outbound-client-key needs --outbound-client-cert too"),
        "{stderr}"
    );
    db.drop_database().await;
}

/// A participant on `127.0.0.1` with a certificate from `ca` that requires a client
/// certificate from `ca` too.
async fn mtls_participant(ca: &Ca) -> Recorder {
    idem::transport::install_crypto_provider();
    let leaf = ca.issue("participant", Usage::Server);
    let verifier = rustls::server::WebPkiClientVerifier::builder(ca.roots())
        .build()
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(leaf.chain(), leaf.key())
        .unwrap();
    Recorder::start_tls(TlsAcceptor::from(Arc::new(config))).await
}

/// The outbound TLS flags: `ca` as the CA bundle, and `client` as the identity.
fn outbound_flags<'a>(
    ca: Option<&'a Path>,
    client: Option<&'a (PathBuf, PathBuf)>,
) -> Vec<&'a str> {
    let mut flags = vec!["--max-attempts", "2"];
    if let Some(ca) = ca {
        flags.extend(["--outbound-ca-file", ca.to_str().unwrap()]);
    }
    if let Some((cert, key)) = client {
        flags.extend([
            "--outbound-client-cert",
            cert.to_str().unwrap(),
            "--outbound-client-key",
            key.to_str().unwrap(),
        ]);
    }
    flags
}

/// Starts a one-step saga on `p` through `idem`.
async fn saga(idem: &idem_client::Client, p: &Recorder, gid: &str) {
    let answer = idem
        .saga(gid)
        .step(p.url("/s1/action"), p.url("/s1/compensate"), json!({}))
        .send()
        .await;
    created(answer.unwrap_or_else(|e| panic!("{gid}: {e:?}")));
}

/// The saga's action's last error, once it has one.
async fn action_error(idem: &idem_client::Client, gid: &str) -> String {
    eventually("the action fails", async || {
        let tx = idem.get(gid).await.ok()?;
        assert_ne!(tx.status, Status::Succeeded, "{tx:#?}");
        let action = tx.branches.iter().find(|b| b.action == Action::Action)?;
        action.last_error.clone()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_present_the_client_certificate_and_trust_the_ca_bundle() {
    let (db, dir, ca) = setup("tls_outbound").await;
    let ca_file = ca.write(&dir, "ca.crt");
    let client: Leaf = ca.issue("idem", Usage::Client);
    let client = client.write(&dir, "client");
    let participant = mtls_participant(&ca).await;

    let idem = Child::serve(&db.url, "", &outbound_flags(Some(&ca_file), Some(&client))).await;
    let api = typed::client(&idem.url);
    saga(&api, &participant, "mtls-ok").await;
    let tx = wait_status(&api, "mtls-ok", &[Status::Succeeded], WAIT).await;
    assert_eq!(tx.status, Status::Succeeded);
    assert_eq!(participant.count("mtls-ok", "/s1/action"), 1);
    drop(idem);

    // No client certificate: the participant refuses the handshake, and sees no request.
    let idem = Child::serve(&db.url, "", &outbound_flags(Some(&ca_file), None)).await;
    let api = typed::client(&idem.url);
    saga(&api, &participant, "mtls-no-cert").await;
    // TLS 1.3 sends the refusal after the client thinks the handshake is done: an
    // attempt can fail on the closed connection first ("not ready"); a later one reads
    // the alert.
    let error = eventually("the participant's alert is reported", async || {
        let error = action_error(&api, "mtls-no-cert").await.to_lowercase();
        (error.contains("alert") && error.contains("certificaterequired")).then_some(error)
    })
    .await;
    assert!(error.contains("certificaterequired"), "{error}");
    assert_eq!(participant.count("mtls-no-cert", "/s1/action"), 0);
    drop(idem);

    // No CA bundle: the participant's certificate is not trusted.
    let idem = Child::serve(&db.url, "", &outbound_flags(None, Some(&client))).await;
    let api = typed::client(&idem.url);
    saga(&api, &participant, "mtls-no-ca").await;
    let error = action_error(&api, "mtls-no-ca").await;
    assert!(error.contains("invalid peer certificate"), "{error}");
    assert_eq!(participant.count("mtls-no-ca", "/s1/action"), 0);
    drop(idem);
    db.drop_database().await;
}

/// The operator's commands reach a coordinator behind a private CA with `--ca-file`
/// (or `IDEM_CA_FILE`), and refuse it without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_tx_trusts_a_private_ca_when_told() {
    let (db, dir, ca) = setup("tls_tx_ca").await;
    let leaf = ca.issue("idem", Usage::Server);
    let idem = serve_https(&db, &dir, &leaf, &[]).await;
    let ca_file = ca.write(&dir, "ca.crt");
    let ca_path = ca_file.to_str().unwrap();
    let list = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["tx", "list", "--server", idem.url.as_str()];
        args.extend_from_slice(extra);
        common::idem_run(&args, env)
    };
    let trusted = list(&["--ca-file", ca_path], &[]);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let by_env = list(&[], &[("IDEM_CA_FILE", ca_path)]);
    assert!(
        by_env.status.success(),
        "{}",
        String::from_utf8_lossy(&by_env.stderr)
    );
    let untrusted = list(&[], &[]);
    assert!(
        !untrusted.status.success(),
        "a private CA was trusted without --ca-file"
    );
    db.drop_database().await;
}

/// DTM's gRPC door serves TLS with the API's certificate (ALPN h2), to a gRPC stack of its
/// own (Python's grpcio, which trusts the test CA only); a plain-text gRPC client gets no
/// answer from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_door_serves_tls_with_the_apis_certificate() {
    let python = std::env::var("IDEM_GRPC_PYTHON").unwrap_or_else(|_| {
        panic!("not run: set IDEM_GRPC_PYTHON to a python with grpcio-tools (scripts/test)")
    });
    let (db, dir, ca) = setup("tls_grpc").await;
    let leaf = ca.issue("idem-grpc", Usage::Server);
    let idem = serve_https(&db, &dir, &leaf, &["--grpc-listen", "127.0.0.1:0"]).await;
    let grpc = idem.grpc_addr().expect("a gRPC listener").to_owned();
    let ca_file = ca.write(&dir, "ca");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/dtm_grpc/client.py");
    let run = |tls: bool| {
        let mut command = std::process::Command::new(&python);
        command
            .arg(script)
            .env("IDEM_GRPC", &grpc)
            .env("ONLY", "new_gid");
        if tls {
            command.env("IDEM_GRPC_CA", &ca_file);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(run(true), "NewGid OK 32");
    assert_eq!(run(false), "NewGid UNAVAILABLE");
    drop(idem);
    db.drop_database().await;
}
