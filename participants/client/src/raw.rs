//! The client's requests answered with the API's JSON as it came.

use serde_json::Value;

use crate::{Client, Error, ListQuery, Operation};

/// [`Client`]'s requests whose answers are the API's JSON, unparsed into views: for a tool
/// that prints or forwards them as the coordinator wrote them. Made by [`Client::raw`];
/// the same retries and errors.
#[derive(Clone, Copy, Debug)]
pub struct Raw<'a> {
    client: &'a Client,
}

impl<'a> Raw<'a> {
    pub(crate) fn new(client: &'a Client) -> Raw<'a> {
        Raw { client }
    }

    /// `GET /api/v1/transactions/{gid}`.
    pub async fn get(&self, gid: &str) -> Result<Value, Error> {
        self.client.fetch(gid).await
    }

    /// `GET /api/v1/transactions?...`.
    pub async fn list(&self, query: &ListQuery) -> Result<Value, Error> {
        self.client.fetch_page(query).await
    }

    /// `POST .../abort`.
    pub async fn abort(
        &self,
        gid: &str,
        reason: Option<&str>,
        wait_result: bool,
    ) -> Result<Value, Error> {
        self.client
            .operate(gid, Operation::Abort, reason, wait_result)
            .await
    }

    /// `POST .../retry`.
    pub async fn retry(&self, gid: &str) -> Result<Value, Error> {
        self.client
            .operate(gid, Operation::Retry, None, false)
            .await
    }

    /// `POST .../force-stop`.
    pub async fn force_stop(&self, gid: &str, reason: &str) -> Result<Value, Error> {
        self.client
            .operate(gid, Operation::ForceStop, Some(reason), false)
            .await
    }

    /// `POST /api/v1/bulk`: an operator's retry, force-stop or abort of the transactions
    /// `request` selects (see docs/api.md); each one's outcome in the answer.
    pub async fn bulk(&self, request: &Value) -> Result<Value, Error> {
        self.client.post(self.client.bulk_url(), request).await
    }
}
