//! A thread's removal on PostgreSQL ([`crate::checkpoint::Checkpointer::remove_thread`]): in one transaction,
//! under the thread's admission lock (the queue's) and its lease, taken as a claim takes it, so
//! that no run is admitted to, claimed on or writing to the thread while it goes, whichever
//! process asks.

use super::PostgresCheckpointer;
use super::apply::{DB_NOW_MS, LEASE_COLS, load_lease};
use crate::checkpoint::{LeaseClaim, Removal, Removed, Result};

impl PostgresCheckpointer {
    pub(super) fn remove(&self, thread_id: &str, removal: &Removal, claim: &LeaseClaim) -> Result<Removed> {
        let (pool, thread_id, removal, claim, doubt) = (
            self.pool.clone(),
            thread_id.to_owned(),
            removal.clone(),
            claim.clone(),
            super::doubt::InDoubt::new(),
        );
        self.retrying(move || {
            let (pool, thread_id, removal, claim, doubt) = (
                pool.clone(),
                thread_id.clone(),
                removal.clone(),
                claim.clone(),
                doubt.clone(),
            );
            async move {
                let mut client = pool.get().await?;
                // Removed by a try whose commit went unanswered: not found missing now.
                if let Some(removed) = doubt.settled(&client).await? {
                    return Ok(removed);
                }
                let tx = client.transaction().await?;
                // No run is admitted to the thread meanwhile (admission takes the same lock).
                let (xid, locked) = tokio::join!(super::doubt::xid(&tx), async {
                    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&thread_id])
                        .await
                });
                let xid = xid?;
                locked?;
                // A claim in progress holds its run's row: this waits for it, then sees it running.
                let active = tx
                    .query_opt(
                        "SELECT run_id, status FROM runs WHERE thread_id = $1 AND status IN ('pending', 'running') \
                         LIMIT 1 FOR UPDATE",
                        &[&thread_id],
                    )
                    .await?;
                if let Some(run) = active {
                    let (id, status): (String, String) = (run.try_get(0)?, run.try_get(1)?);
                    return Ok(Removed::Busy(format!("run {id} on it is {status}")));
                }
                let thread: Option<String> = tx
                    .query_opt("SELECT updated_at FROM threads WHERE thread_id = $1", &[&thread_id])
                    .await?
                    .map(|r| r.try_get(0))
                    .transpose()?;
                let meta = match tx
                    .query_opt(
                        "SELECT thread_id, created_at, updated_at, metadata, ttl, expires_at FROM thread_meta \
                         WHERE thread_id = $1 FOR UPDATE",
                        &[&thread_id],
                    )
                    .await?
                {
                    Some(row) => Some(super::runs::meta_from_row(&row)?.into_meta()?),
                    None => None,
                };
                let run: Option<String> = tx
                    .query_one("SELECT max(updated_at) FROM runs WHERE thread_id = $1", &[&thread_id])
                    .await?
                    .try_get(0)?;
                if thread.is_none() && meta.is_none() && run.is_none() {
                    return Ok(Removed::Missing);
                }
                // The thread's lease, as a claim takes it: refused while another holds it live
                // (unless it is the holder the claim replaces, known to be gone).
                // Until this commits, whoever asks for it waits; the row goes with the thread.
                let sql = format!(
                    "INSERT INTO leases ({LEASE_COLS}) VALUES ($1, $2, 1, $3, $4, $5, {DB_NOW_MS} + $6) \
                     ON CONFLICT (thread_id) DO UPDATE SET generation = leases.generation + 1, \
                       acquired_at = excluded.acquired_at, owner = excluded.owner, pid = excluded.pid, \
                       host = excluded.host, expires_at = excluded.expires_at \
                     WHERE leases.expires_at <= {DB_NOW_MS} OR leases.owner = $7 \
                     RETURNING 1"
                );
                let ttl = i64::try_from(claim.ttl.as_millis()).unwrap_or(i64::MAX / 4);
                let taken = tx
                    .query_opt(
                        &sql,
                        &[
                            &thread_id,
                            &claim.owner,
                            &i64::from(claim.pid),
                            &claim.host,
                            &crate::clock::now(),
                            &ttl,
                            &claim.replace,
                        ],
                    )
                    .await?;
                if taken.is_none() {
                    let holder = load_lease(&tx, &thread_id, false).await?;
                    return Ok(Removed::Busy(
                        holder.map_or_else(|| "its lease is held".to_string(), |l| l.to_string()),
                    ));
                }
                if !removal.allows(thread.as_deref(), meta.as_ref(), run.as_deref()) {
                    return Ok(Removed::Kept);
                }
                // Its subgraphs' threads go with it.
                let nested = format!(
                    "{}/%",
                    thread_id.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
                );
                let mut ids: Vec<String> = tx
                    .query("SELECT thread_id FROM threads WHERE thread_id LIKE $1", &[&nested])
                    .await?
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<std::result::Result<_, _>>()?;
                ids.push(thread_id.clone());
                let hashes: Vec<String> = tx
                    .query(
                        "DELETE FROM blob_refs WHERE thread_id = ANY($1) RETURNING hash",
                        &[&ids],
                    )
                    .await?
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<std::result::Result<_, _>>()?;
                for table in [
                    "writes",
                    "state_values",
                    "checkpoints",
                    "thread_inputs",
                    "threads",
                    "leases",
                ] {
                    tx.execute(&format!("DELETE FROM {table} WHERE thread_id = ANY($1)"), &[&ids])
                        .await?;
                }
                if !hashes.is_empty() {
                    tx.execute(
                        "DELETE FROM blobs b WHERE b.hash = ANY($1) \
                         AND NOT EXISTS (SELECT 1 FROM blob_refs r WHERE r.hash = b.hash)",
                        &[&hashes],
                    )
                    .await?;
                }
                super::runs::delete_thread_records(&tx, &thread_id).await?;
                doubt.commit(tx, xid, Removed::Removed).await
            }
        })
    }
}
