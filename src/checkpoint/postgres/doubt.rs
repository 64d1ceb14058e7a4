//! A transaction tried again after its `COMMIT` was sent and its answer lost.
//!
//! A connection that breaks between a `COMMIT` reaching the server and its answer reaching the
//! client leaves the client unable to tell whether the transaction committed. Made again
//! blindly, one that had committed meets its own rows: a thread created twice, a checkpoint
//! stored twice, a run found already ended (and so answered differently). Each try here reads
//! its transaction's id alongside its first statement (sent together: no round trip of its
//! own), and a try whose `COMMIT` went unanswered leaves that id and its answer behind. The
//! next try asks the server what became of that transaction (`txid_status`) before anything
//! else: committed, it answers as the first try would have; aborted, it is made again;
//! still in progress (its connection not yet found broken by the server), the call waits as
//! for a database out of reach.

use std::sync::{Arc, Mutex};

use deadpool_postgres::{GenericClient, Transaction};

use crate::checkpoint::{CheckpointError, Result};

/// What a call's earlier try left behind: the id of the transaction whose `COMMIT` was sent
/// and not answered, and what that try answered.
pub(super) struct InDoubt<T> {
    sent: Mutex<Option<(i64, T)>>,
}

impl<T> InDoubt<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(InDoubt { sent: Mutex::new(None) })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(i64, T)>> {
        self.sent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before a try: the answer of an earlier try whose `COMMIT` went unanswered, if it
    /// committed (`None`: there was none, or it did not commit, and this try goes on).
    pub(super) async fn settled(&self, client: &impl GenericClient) -> Result<Option<T>> {
        let Some(xid) = self.slot().as_ref().map(|(xid, _)| *xid) else {
            return Ok(None);
        };
        let stmt = client.prepare_cached("SELECT txid_status($1)").await?;
        let status: Option<String> = client.query_one(&stmt, &[&xid]).await?.try_get(0)?;
        match status.as_deref() {
            Some("committed") => Ok(self.slot().take().map(|(_, answer)| answer)),
            Some("aborted") => {
                self.slot().take();
                Ok(None)
            }
            Some("in progress") => Err(CheckpointError::Unavailable(format!(
                "postgres: transaction {xid}, whose commit was sent and not answered, is still in progress"
            ))),
            other => Err(CheckpointError::Backend(format!(
                "postgres: transaction {xid}, whose commit was sent and not answered, cannot be looked up \
                 ({})",
                other.unwrap_or("no status")
            ))),
        }
    }

    /// Commits `tx`, whose id is `xid` (see [`xid`]) and whose work answered `answer`. A
    /// `COMMIT` sent and not answered leaves both behind for the next try's [`Self::settled`].
    pub(super) async fn commit(&self, tx: Transaction<'_>, xid: i64, answer: T) -> Result<T> {
        match tx.commit().await.map_err(CheckpointError::from) {
            Ok(()) => Ok(answer),
            Err(e @ CheckpointError::Unavailable(_)) => {
                *self.slot() = Some((xid, answer));
                Err(e)
            }
            // The server answered: the transaction did not commit.
            Err(e) => Err(e),
        }
    }
}

/// The id of transaction `tx` (one is given to it now if it had none). Awaited together with
/// the transaction's first statement, it is sent with it.
pub(super) async fn xid(tx: &Transaction<'_>) -> Result<i64> {
    for message in tx.simple_query("SELECT txid_current()").await? {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = message
            && let Some(id) = row.get(0).and_then(|s| s.parse().ok())
        {
            return Ok(id);
        }
    }
    Err(CheckpointError::Backend(
        "postgres: txid_current() answered no id".into(),
    ))
}
