//! The coordinator as an application or an operator meets it: through the typed client
//! (`idem-client`), with answers parsed into the views and errors carrying the API's codes.

use std::time::Duration;

use idem_client::{
    Client, Created, Error, ErrorBody, RetryPolicy, Status, Tcc, TryOutcome, TxView,
};
use serde_json::json;

use super::recorder::Recorder;

/// A typed client of the coordinator at `base`. Its own retries are off: a test must see
/// every failure the coordinator answers, not a later repeat that hides it.
pub fn client(base: &str) -> Client {
    idem::transport::install_crypto_provider();
    Client::new(base)
        .expect("a valid coordinator URL")
        .retry_policy(RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        })
}

/// Polls `get` until the transaction's status is one of `statuses`; panics with the last
/// answer after `timeout`.
pub async fn wait_status(
    client: &Client,
    gid: &str,
    statuses: &[Status],
    timeout: Duration,
) -> TxView {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let answer = client.get(gid).await;
        if let Ok(tx) = &answer
            && statuses.contains(&tx.status)
        {
            return answer.unwrap();
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{gid} did not reach {statuses:?} in {timeout:?}: {answer:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_status`] for each of `gids`.
pub async fn wait_all(client: &Client, gids: &[String], statuses: &[Status], timeout: Duration) {
    for gid in gids {
        wait_status(client, gid, statuses, timeout).await;
    }
}

/// `abort`, `retry` or `force-stop` with `wait_result`: answered once the transaction has
/// settled. idem-client's operations answer at once (they send no `wait_result`), and these
/// tests check the settled outcome in the operation's own answer.
pub async fn operate_waiting(
    client: &Client,
    gid: &str,
    operation: &str,
    reason: Option<&str>,
) -> Result<TxView, Error> {
    let mut body = json!({"wait_result": true});
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    let answer = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/transactions/{gid}/{operation}",
            client.base_url()
        ))
        .json(&body)
        .send()
        .await
        .map_err(|e| Error::Transport(e.to_string().into()))?;
    let status = answer.status().as_u16();
    let text = answer
        .text()
        .await
        .map_err(|e| Error::Transport(e.to_string().into()))?;
    if status != 200 {
        let body: ErrorBody = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not an error body ({e}): {text}"));
        return Err(Error::Api {
            status,
            code: body.error.code,
            message: body.error.message,
        });
    }
    Ok(serde_json::from_str(&text).unwrap_or_else(|e| panic!("not a view ({e}): {text}")))
}

/// The API's status and code of a refused request, for assertions; `None` when it was not
/// refused by the coordinator.
pub fn refusal<T>(result: &Result<T, Error>) -> Option<(u16, &str)> {
    match result {
        Err(Error::Api { status, code, .. }) => Some((*status, code.as_str())),
        _ => None,
    }
}

/// Registers branch `id` of `tcc`: its Confirm and Cancel at `/{id}/confirm` and
/// `/{id}/cancel` on the recorder, `{"branch": id}` as payload.
pub async fn register(tcc: &Tcc, p: &Recorder, id: &str) -> Result<(), Error> {
    let (confirm, cancel) = branch_urls(p, id);
    tcc.register(id, &confirm, &cancel, json!({"branch": id}))
        .await
}

/// [`register`], and the coordinator calls its Try at `/{id}/try`. A Try that did not
/// succeed comes back as the API's refusal (`409 try_failed`, `425 try_in_progress`, `502
/// try_unknown`), which is how these tests assert on it.
pub async fn register_with_try(tcc: &Tcc, p: &Recorder, id: &str) -> Result<(), Error> {
    let (confirm, cancel) = branch_urls(p, id);
    let try_url = p.url(&format!("/{id}/try"));
    let outcome = tcc
        .register_with_try(id, &try_url, &confirm, &cancel, json!({"branch": id}))
        .await?;
    let (status, code) = match outcome {
        TryOutcome::Succeeded => return Ok(()),
        TryOutcome::Failed(_) => (409, "try_failed"),
        TryOutcome::InProgress(_) => (425, "try_in_progress"),
        TryOutcome::Unknown(_) => (502, "try_unknown"),
    };
    Err(Error::Api {
        status,
        code: code.into(),
        message: outcome.detail().unwrap_or_default().into(),
    })
}

fn branch_urls(p: &Recorder, id: &str) -> (String, String) {
    (
        p.url(&format!("/{id}/confirm")),
        p.url(&format!("/{id}/cancel")),
    )
}

/// A create's answer, asserted to be a creation (`201`), not the answer to a repeat (`200`):
/// these tests use fresh gids and send each create once (the client's retries are off).
pub fn created(answer: Created) -> TxView {
    assert!(
        answer.new,
        "{}: the create answered 200 (a repeat), not 201",
        answer.view.gid
    );
    answer.view
}

/// [`created`] for a TCC handle.
pub fn created_tcc(tcc: Tcc) -> Tcc {
    assert!(
        tcc.created_now(),
        "{}: the create answered 200 (a repeat), not 201",
        tcc.gid()
    );
    tcc
}
