//! Savepoints of a group transaction: the events of many runs committed
//! together, each run's statements undone alone when they fail
//! (docs/decisions/0023-group-commit.md).
//!
//! One name serves every item: a group never releases a savepoint (the
//! commit does), so `ROLLBACK TO` always names the item that just failed,
//! and each item costs one statement, not two.

use sqlx::PgConnection;

use crate::StoreError;

/// Marks where the next item of a group begins.
pub async fn savepoint(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query("SAVEPOINT group_item").execute(conn).await?;
    Ok(())
}

/// Undoes what the item begun at the last [`savepoint`] wrote, and the
/// locks it took; what the group's earlier items wrote stays.
pub async fn rollback_item(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query("ROLLBACK TO SAVEPOINT group_item")
        .execute(conn)
        .await?;
    Ok(())
}
