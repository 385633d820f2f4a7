//! The limits on what the API accepts, as a client hits them: over real HTTP, through both
//! front doors, on SQLite, PostgreSQL and MariaDB. A refused request answers 400 with a
//! stable code and leaves nothing behind.

//!
//! The tests are in `validation/`: `texts.rs` (lengths, characters, URLs, headers,
//! payloads) and `options.rs` (the numeric options and the list's page size); this file
//! holds what they share.

use crate::common;
mod options;
mod texts;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem::server::ServerConfig;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// The native API, the DTM API, a participant, and the backend's name.
struct Doors {
    native: Api,
    dtm: Api,
    p: Recorder,
    b: &'static str,
}

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    each_backend_with(test, |_| {}, body).await;
}

/// [`each_backend`] with the coordinators' configuration changed by `tweak`. The server's
/// own limits on options are opened to the table's bounds, which these tests hold the
/// doors to (`tests/it/caps.rs` tests the server's limits).
async fn each_backend_with<F, Fut>(test: &str, tweak: fn(&mut ServerConfig), body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in idem_participant::testing::all(test).await {
        let server = common::coordinator_with(&db.url, |c| {
            c.option_limits = idem::api::validate::OptionLimits::OPEN;
            tweak(c);
        })
        .await;
        let doors = Doors {
            native: Api::new(server.url()),
            dtm: Api::new(format!("{}/api/dtmsvr", server.url())),
            p: Recorder::start().await,
            b: db.backend.name(),
        };
        body(doors).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

fn code(answer: &Value) -> Option<&str> {
    answer["error"]["code"].as_str()
}

/// Fails unless the answer is a 400 with `expected`, a message, and (DTM) no
/// `dtm_result`, which DTM clients would read as a business outcome.
fn refused(what: &str, (status, answer): (u16, Value), expected: &str) {
    assert_eq!(
        (status, code(&answer)),
        (400, Some(expected)),
        "{what}: {}",
        short(&answer)
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{what}: no message");
    assert!(answer.get("dtm_result").is_none(), "{what}: {answer}");
}

/// An answer for an assertion message: a refused 65 KB URL must not print 65 KB.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 600 {
        format!("{}... ({} bytes)", &text[..600], text.len())
    } else {
        text
    }
}

async fn assert_absent(d: &Doors, gid: &str) {
    let (status, _) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    assert_eq!(status, 404, "{}: {gid} was stored", d.b);
}

fn saga(p: &Recorder, gid: &str, action: &str) -> Value {
    json!({"gid": gid, "kind": "saga",
           "steps": [{"action": action, "compensate": p.url("/c")}]})
}

fn dtm_saga(p: &Recorder, gid: &str, action: &str) -> Value {
    json!({"gid": gid, "trans_type": "saga",
           "steps": [{"action": action, "compensate": p.url("/c")}], "payloads": ["{}"]})
}
