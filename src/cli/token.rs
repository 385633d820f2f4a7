//! `idem token`: issuing, listing and revoking API tokens on the coordinator's database.
//!
//! It works on the database, not through a coordinator, because the first token cannot be
//! asked for with a token. The full token is printed once, by `issue`; only its hash is
//! stored. Coordinators see a new token at once (an unknown id makes them read the table)
//! and a revocation within `--token-refresh-ms`.

use clap::{Args, Subcommand};
use serde_json::json;

use super::{BoxError, DatabaseArgs, redact};
use crate::auth::{Role, TokenAdmin};
use crate::store::{self, ConnectOptions};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a token and print it (the only time it is shown).
    Issue {
        #[command(flatten)]
        db: DatabaseArgs,
        /// The tenant the token acts in (a-z 0-9 _ -, at most 32).
        #[arg(long, default_value = crate::tenant::DEFAULT_TENANT)]
        tenant: String,
        /// client: create, submit, abort and read; operator: also retry and force-stop,
        /// and the protected /metrics and readiness; admin: also tokens.
        #[arg(long)]
        role: Role,
        /// Who or what holds it, for `idem token list`.
        #[arg(long, default_value = "")]
        label: String,
        /// Print a JSON object instead of the token alone.
        #[arg(long)]
        json: bool,
    },
    /// List tokens (their ids, never their secrets).
    List(ListArgs),
    /// Revoke a token by its id (the part after `idem_`, before the next `_`).
    Revoke {
        #[command(flatten)]
        db: DatabaseArgs,
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

async fn open(db: &DatabaseArgs) -> Result<TokenAdmin, BoxError> {
    let store = store::connect_existing(&db.database_url, &ConnectOptions::default())
        .await
        .map_err(|e| format!("cannot open {}: {e}", redact(&db.database_url)))?;
    // The token table arrives with a migration: a database of an older idem gets it here,
    // as `idem serve` would give it.
    store.migrate().await?;
    Ok(TokenAdmin::new(store))
}

pub async fn run(command: TokenCommand) -> Result<(), BoxError> {
    match command {
        TokenCommand::Issue {
            db,
            tenant,
            role,
            label,
            json,
        } => {
            let tokens = open(&db).await?;
            let now = tokens.now().await?;
            let issued = tokens.issue(&tenant, role, &label, now).await?;
            if json {
                println!(
                    "{}",
                    json!({"token": issued.token, "id": issued.record.id, "tenant": tenant,
                           "role": role.as_str(), "label": label})
                );
            } else {
                println!("{}", issued.token);
            }
            Ok(())
        }
        TokenCommand::List(ListArgs { db, json }) => {
            let tokens = open(&db).await?.list().await?;
            if !json {
                println!(
                    "{:<12}  {:<32}  {:<8}  {:<24}  {:<24}  LABEL",
                    "ID", "TENANT", "ROLE", "CREATED", "REVOKED"
                );
            }
            for t in tokens {
                let revoked = t.revoked_at.map(crate::timestamp::rfc3339);
                if json {
                    println!(
                        "{}",
                        json!({"id": t.id, "tenant": t.tenant, "role": t.role, "label": t.label,
                               "created_at": t.created_at, "revoked_at": t.revoked_at})
                    );
                } else {
                    println!(
                        "{:<12}  {:<32}  {:<8}  {:<24}  {:<24}  {}",
                        t.id,
                        t.tenant,
                        t.role,
                        crate::timestamp::rfc3339(t.created_at),
                        revoked.unwrap_or_else(|| "-".into()),
                        t.label
                    );
                }
            }
            Ok(())
        }
        TokenCommand::Revoke { db, id } => {
            let tokens = open(&db).await?;
            let now = tokens.now().await?;
            if tokens.revoke(&id, now).await? {
                println!("revoked {id}");
                Ok(())
            } else {
                Err(format!("no live token with id {id:?}").into())
            }
        }
    }
}
