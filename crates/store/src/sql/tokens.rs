//! API tokens: the rows behind `idem token` and the authentication cache.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::{SqlStore, StoreDatabase, is_unique_violation};
use crate::{Result, TokenRecord};
use idem_core::Millis;

type TokenTuple = (String, String, String, String, String, i64, Option<i64>);

impl<DB> SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> TokenTuple: sqlx::FromRow<'r, DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    /// Inserts a token; false when its id exists (ids are random: the caller draws again).
    pub(super) async fn insert_token_row(&self, token: &TokenRecord) -> Result<bool> {
        let sql = self.sql.dynamic(&format!(
            "INSERT INTO idem_token (id, tenant, role, secret_hash, label, created_at) \
             VALUES (?, ?, ?, ?, ?, ?){}",
            DB::ON_DUPLICATE_DO_NOTHING
        ));
        let insert = sqlx::query::<DB>(sqlx::AssertSqlSafe(sql))
            .bind(token.id.as_str())
            .bind(token.tenant.as_str())
            .bind(token.role.as_str())
            .bind(token.secret_hash.as_str())
            .bind(token.label.as_str())
            .bind(token.created_at)
            .execute(&self.pool)
            .await;
        match insert {
            Ok(done) => Ok(DB::rows_affected(&done) == 1),
            Err(e) if is_unique_violation(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn token_rows(&self) -> Result<Vec<TokenRecord>> {
        let sql = "SELECT id, tenant, role, secret_hash, label, created_at, revoked_at \
                   FROM idem_token ORDER BY created_at, id";
        let rows: Vec<TokenTuple> = sqlx::query_as(sql).fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, tenant, role, secret_hash, label, created_at, revoked_at)| TokenRecord {
                    id,
                    tenant,
                    role,
                    secret_hash,
                    label,
                    created_at,
                    revoked_at,
                },
            )
            .collect())
    }

    /// Marks a token revoked (once: a second revocation keeps the first time).
    pub(super) async fn revoke_token_row(&self, id: &str, now: Millis) -> Result<bool> {
        let sql = self
            .sql
            .dynamic("UPDATE idem_token SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL");
        let done = sqlx::query::<DB>(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
