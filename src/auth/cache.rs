//! Tokens verified in memory: the token table is read at start and then every refresh
//! interval, so a known token is checked without a database round trip. A token issued
//! since the last read is found by a read its first use causes; such reads happen at most
//! once per [`MISS_REFRESH_GAP`] whatever ids callers make up (callers in between wait for
//! the next one), so they cannot load the database. A revocation takes effect within one
//! refresh interval (`--token-refresh-ms`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::admin::{TokenAdmin, TokenRecord};
use super::tokens::{parse, secret_matches};
use super::{Principal, Role};
use crate::store::StoreError;

/// Shortest time between two refreshes caused by an unknown token id.
pub const MISS_REFRESH_GAP: Duration = Duration::from_secs(1);

/// Why a presented token was refused; each is a stable code of the 401 answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not of the form `idem_<id>_<secret>`.
    Malformed,
    /// No such token, or the secret does not match.
    Invalid,
    Revoked,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Missing => "token_missing",
            Refusal::Malformed => "token_malformed",
            Refusal::Invalid => "token_invalid",
            Refusal::Revoked => "token_revoked",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "this route needs an API token: Authorization: Bearer <token>",
            Refusal::Malformed => "the bearer token is not an idem token (idem_<id>_<secret>)",
            Refusal::Invalid => "the bearer token is not valid",
            Refusal::Revoked => "the bearer token was revoked",
        }
    }
}

struct Entry {
    secret_hash: String,
    principal: Option<Principal>,
    revoked: bool,
}

pub struct TokenCache {
    tokens: TokenAdmin,
    entries: RwLock<HashMap<String, Entry>>,
    /// Serialises refreshes.
    refreshing: Mutex<()>,
    /// When an unknown id last caused a refresh.
    last_miss: Mutex<Option<Instant>>,
}

impl TokenCache {
    /// A cache loaded with every token now.
    pub async fn load(tokens: TokenAdmin) -> Result<Arc<TokenCache>, StoreError> {
        let cache = Arc::new(TokenCache {
            tokens,
            entries: RwLock::new(HashMap::new()),
            refreshing: Mutex::new(()),
            last_miss: Mutex::new(None),
        });
        cache.refresh().await?;
        Ok(cache)
    }

    /// Reads the token table again.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.refreshing.lock().await;
        self.reload().await
    }

    async fn reload(&self) -> Result<(), StoreError> {
        let rows = self.tokens.list().await?;
        let entries = rows
            .into_iter()
            .map(|row| (row.id.clone(), entry(row)))
            .collect();
        *self.entries.write().expect("token cache lock") = entries;
        Ok(())
    }

    /// Refreshes in the background every `every` until the returned task is dropped or
    /// aborted; a failed refresh keeps the tokens already known (and is logged).
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = cache.refresh().await {
                    tracing::warn!(error = %e, "could not refresh the API tokens; keeping the known ones");
                }
            }
        })
    }

    /// Who presents `bearer`, or why it is refused. A wrong secret for a known id takes
    /// the same way as an unknown id (the refresh after a miss, with its wait): answered
    /// at once, it would tell a caller which ids exist.
    pub async fn verify(&self, bearer: &str) -> Result<Principal, Refusal> {
        let presented = parse(bearer).ok_or(Refusal::Malformed)?;
        match self.lookup(presented.id, presented.secret) {
            Some(Err(Refusal::Invalid)) | None => {}
            Some(found) => return found,
        }
        self.refresh_after_miss().await;
        self.lookup(presented.id, presented.secret)
            .unwrap_or(Err(Refusal::Invalid))
    }

    fn lookup(&self, id: &str, secret: &str) -> Option<Result<Principal, Refusal>> {
        let entries = self.entries.read().expect("token cache lock");
        let entry = entries.get(id)?;
        if !secret_matches(secret, &entry.secret_hash) {
            return Some(Err(Refusal::Invalid));
        }
        if entry.revoked {
            return Some(Err(Refusal::Revoked));
        }
        Some(entry.principal.clone().ok_or(Refusal::Invalid))
    }

    /// Reads the table again for an unknown id, at most once per [`MISS_REFRESH_GAP`]:
    /// a caller that comes sooner waits for the next read (which answers every caller
    /// waiting then), so a new token works within the gap and made-up ids cost one read
    /// per gap, however many arrive.
    async fn refresh_after_miss(&self) {
        let arrived = Instant::now();
        let mut last = self.last_miss.lock().await;
        if let Some(at) = *last {
            if at >= arrived {
                return;
            }
            let wait = MISS_REFRESH_GAP.saturating_sub(at.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        // Counted whatever the outcome: a database outage must not turn every unknown
        // token into a query.
        *last = Some(Instant::now());
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "could not refresh the API tokens after an unknown id");
        }
    }

    /// How many live (not revoked) tokens are known.
    pub fn live_tokens(&self) -> usize {
        let entries = self.entries.read().expect("token cache lock");
        entries.values().filter(|e| !e.revoked).count()
    }
}

fn entry(row: TokenRecord) -> Entry {
    // A role this build does not know (a newer version's) grants nothing.
    let principal = row.role.parse::<Role>().ok().map(|role| Principal {
        tenant: row.tenant.clone(),
        role,
        token_id: Some(row.id.clone()),
        tokenless: false,
    });
    Entry {
        secret_hash: row.secret_hash,
        principal,
        revoked: row.revoked_at.is_some(),
    }
}
