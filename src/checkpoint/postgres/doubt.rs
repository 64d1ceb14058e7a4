//! A transaction tried again after its `COMMIT` was sent and its answer lost.
//!
//! A connection that breaks between a `COMMIT` reaching the server and its answer reaching the
//! client leaves the client unable to tell whether the transaction committed. Made again
//! blindly, one that had committed meets its own rows: a thread created twice, a checkpoint
//! stored twice, a run found already ended (and so answered differently). Each try here reads
//! its transaction's id alongside its first statement (sent together: no round trip of its
//! own), and a try whose `COMMIT` went unanswered leaves that id and its answer behind. The
//! next try asks the server what became of that transaction (`txid_status`) before anything
//! else: committed, it answers as the first try would have; aborted, it is made again.
//! Still in progress, its `COMMIT` never reached the server, whose session waits for a client
//! that is gone (a connection cut without a word, which the server finds out only after a
//! minute): that session is ended (`pg_terminate_backend`, if it still holds that very
//! transaction), which aborts the transaction, and the call looks again after the pause it
//! takes for a database out of reach.

use std::sync::{Arc, Mutex};

use deadpool_postgres::{GenericClient, Transaction};

use crate::checkpoint::{CheckpointError, Result};

/// A transaction: its id, and the server process of the session that holds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Xid {
    id: i64,
    backend: i32,
}

/// What a call's earlier try left behind: the transaction whose `COMMIT` was sent and not
/// answered, and what that try answered.
pub(super) struct InDoubt<T> {
    sent: Mutex<Option<(Xid, T)>>,
}

impl<T> InDoubt<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(InDoubt { sent: Mutex::new(None) })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(Xid, T)>> {
        self.sent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before a try: the answer of an earlier try whose `COMMIT` went unanswered, if it
    /// committed (`None`: there was none, or it did not commit, and this try goes on).
    pub(super) async fn settled(&self, client: &impl GenericClient) -> Result<Option<T>> {
        let Some(xid) = self.slot().as_ref().map(|(xid, _)| *xid) else {
            return Ok(None);
        };
        let stmt = client.prepare_cached("SELECT txid_status($1)").await?;
        let status: Option<String> = client.query_one(&stmt, &[&xid.id]).await?.try_get(0)?;
        match status.as_deref() {
            Some("committed") => Ok(self.slot().take().map(|(_, answer)| answer)),
            Some("aborted") => {
                self.slot().take();
                Ok(None)
            }
            Some("in progress") => {
                // Its session, if it still holds this transaction (a process id may be reused;
                // a transaction id is not), is left by a client that is gone. Ended, the
                // transaction aborts. A role that may not end it (not runner's own) leaves it
                // to the server, which ends it once the session has been idle for a while.
                let end = client
                    .prepare_cached(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE pid = $1 AND backend_xid::text::bigint = $2 % 4294967296",
                    )
                    .await?;
                let ended = client.query(&end, &[&xid.backend, &xid.id]).await;
                Err(CheckpointError::Unavailable(format!(
                    "postgres: transaction {}, whose commit was sent and not answered, is still in progress{}",
                    xid.id,
                    match ended {
                        Ok(rows) if !rows.is_empty() => "; its session was ended",
                        Ok(_) => "",
                        Err(_) => "; its session could not be ended",
                    }
                )))
            }
            other => Err(CheckpointError::Backend(format!(
                "postgres: transaction {}, whose commit was sent and not answered, cannot be looked up ({})",
                xid.id,
                other.unwrap_or("no status")
            ))),
        }
    }

    /// Commits `tx`, whose id is `xid` (see [`xid`]) and whose work answered `answer`. A
    /// `COMMIT` sent and not answered leaves both behind for the next try's [`Self::settled`].
    pub(super) async fn commit(&self, tx: Transaction<'_>, xid: Xid, answer: T) -> Result<T> {
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

/// Transaction `tx` (given an id now if it had none). Awaited together with the
/// transaction's first statement, it is sent with it.
pub(super) async fn xid(tx: &Transaction<'_>) -> Result<Xid> {
    for message in tx.simple_query("SELECT txid_current(), pg_backend_pid()").await? {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = message
            && let Some(id) = row.get(0).and_then(|s| s.parse().ok())
            && let Some(backend) = row.get(1).and_then(|s| s.parse().ok())
        {
            return Ok(Xid { id, backend });
        }
    }
    Err(CheckpointError::Backend(
        "postgres: txid_current() answered no id".into(),
    ))
}
