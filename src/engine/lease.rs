//! A run's hold on its thread: the lease is taken before anything runs on the thread (before
//! the thread is even created), renewed by a heartbeat every third of its time to live, and
//! released when the run ends, however it ends. Every write of the run carries the lease's
//! [`Fence`], so a run whose lease was taken over is refused by the store; the heartbeat's
//! failure also stops the run at the next step boundary.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::EngineError;
use crate::checkpoint::{self, CheckpointError, Checkpointer, Fence, Lease, LeaseClaim};

/// How long a lease lasts without a heartbeat: a run killed outright frees its thread after
/// this long (at once when the new claimant sees on the same host that its process is gone).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The shortest time to live: the heartbeat needs some room.
const MIN_TTL: Duration = Duration::from_millis(300);
/// The longest pause between two looks at a busy lease (`wait`).
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Whose lease a run writes under.
#[derive(Debug, Clone)]
pub enum LeasePolicy {
    /// Take the thread's lease for the run. With `wait`, a lease held by another run is waited
    /// for (polling with backoff); without, the run fails with [`EngineError::Busy`].
    Take { ttl: Duration, wait: bool },
    /// Run under a lease the caller holds and keeps alive: a subgraph's child thread runs under
    /// its parent's lease and takes none of its own.
    Under(Fence),
    /// Run under a lease the caller took for the run (a worker's claim of a queued run takes
    /// the thread's lease in the same transaction): the run renews it and releases it at its
    /// end, as one it took itself.
    Claimed { lease: Box<Lease>, ttl: Duration },
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy::Take {
            ttl: DEFAULT_TTL,
            wait: false,
        }
    }
}

/// A lease the run holds (or borrows, under [`LeasePolicy::Under`]).
pub(super) struct Held {
    store: Arc<dyn Checkpointer>,
    fence: Fence,
    /// Whether this run took the lease (and so renews and releases it).
    owned: bool,
    /// Set by the heartbeat when the lease was taken over.
    lost: Arc<AtomicBool>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Held {
    pub(super) fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Whether the heartbeat found the lease taken over.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Stops the heartbeat and gives the lease up (when this run took it).
    pub(super) fn release(mut self) -> Result<(), EngineError> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        if self.owned && !self.lost() {
            self.store.release_lease(&self.fence)?;
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

/// Takes (or borrows) the lease of `thread_id` per `policy`. `cancel` ends a wait.
pub(super) async fn take(
    store: &Arc<dyn Checkpointer>,
    thread_id: &str,
    policy: &LeasePolicy,
    cancel: &AtomicBool,
) -> Result<Held, EngineError> {
    let (ttl, wait) = match policy {
        LeasePolicy::Under(fence) => {
            return Ok(Held {
                store: store.clone(),
                fence: fence.clone(),
                owned: false,
                lost: Arc::new(AtomicBool::new(false)),
                heartbeat: None,
            });
        }
        LeasePolicy::Claimed { lease, ttl } => {
            return Ok(hold(store, lease, (*ttl).max(MIN_TTL)));
        }
        LeasePolicy::Take { ttl, wait } => ((*ttl).max(MIN_TTL), *wait),
    };
    let mut claim = LeaseClaim {
        thread_id: thread_id.to_string(),
        owner: checkpoint::new_id(),
        pid: std::process::id(),
        host: host().to_string(),
        ttl,
        replace: None,
    };
    let mut backoff = Duration::from_millis(25);
    let lease = loop {
        match store.acquire_lease(&claim) {
            Ok(lease) => break lease,
            Err(CheckpointError::Leased(holder)) => {
                // A holder on this host whose process is gone will never renew: take over now
                // rather than after its expiry (only from that owner, atomically).
                if holder_gone(&holder) && claim.replace.is_none() {
                    claim.replace = Some(holder.owner.clone());
                    continue;
                }
                claim.replace = None;
                if !wait {
                    return Err(EngineError::Busy(holder));
                }
                if cancel.load(Ordering::SeqCst) {
                    return Err(EngineError::Busy(holder));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(hold(store, &lease, ttl))
}

/// A lease this run holds: renewed by its heartbeat, released at its end.
fn hold(store: &Arc<dyn Checkpointer>, lease: &Lease, ttl: Duration) -> Held {
    let lost = Arc::new(AtomicBool::new(false));
    let heartbeat = tokio::spawn(beat(store.clone(), lease.fence(), ttl, lost.clone()));
    Held {
        store: store.clone(),
        fence: lease.fence(),
        owned: true,
        lost,
        heartbeat: Some(heartbeat),
    }
}

/// Renews the lease every third of its time to live until it is lost or the task is aborted.
/// A renewal that fails for another reason (a busy database) is tried again on the next beat:
/// the fence still refuses writes if the lease meanwhile expired and was taken.
async fn beat(store: Arc<dyn Checkpointer>, fence: Fence, ttl: Duration, lost: Arc<AtomicBool>) {
    let period = ttl / 3;
    loop {
        tokio::time::sleep(period).await;
        let (s, f) = (store.clone(), fence.clone());
        let renewed = tokio::task::spawn_blocking(move || s.renew_lease(&f, ttl)).await;
        if let Ok(Err(CheckpointError::LeaseLost(_))) = renewed {
            lost.store(true, Ordering::SeqCst);
            return;
        }
    }
}

/// A claim of a thread's lease for this process itself rather than a run, lasting `ttl`: what
/// a thread's removal takes the thread with (the API's delete, a prune, the TTL sweeper). Its
/// `thread_id` is filled in by whoever uses it.
pub fn own_claim(ttl: Duration) -> crate::checkpoint::LeaseClaim {
    crate::checkpoint::LeaseClaim {
        thread_id: String::new(),
        owner: crate::checkpoint::new_id(),
        pid: std::process::id(),
        host: host().to_string(),
        ttl,
        replace: None,
    }
}

/// This machine's name, as recorded in leases.
pub fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into())
    })
}

/// Whether a lease's holder is known to be gone: it ran on this host and its process is not
/// there any more. Its lease may not have expired, but no one will renew it.
pub fn holder_gone(lease: &Lease) -> bool {
    lease.host == host() && !process_alive(lease.pid)
}

/// Whether process `pid` of this host may still be running. Only Linux's `/proc` can tell it is
/// gone; elsewhere every process is presumed alive and its lease is waited out.
fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() || !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new(&format!("/proc/{pid}")).exists()
}
