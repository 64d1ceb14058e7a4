//! Blocking calls made from async tasks, without stalling the runtime.
//!
//! The stores' traits are synchronous, and their callers are mostly tasks of a multi-threaded
//! tokio runtime, whose threads are few (one a core). A call that answers at once is best made
//! in place. One that does not — a database slow to answer, or out of reach for as long as a
//! call keeps trying — would hold its thread for that long, and a task waiting for a lock such
//! a call holds would hold another: with every thread held so, the process stops answering
//! anything, its probes and its streams' heartbeats included. Here a wait that lasts longer than
//! [`PATIENCE`], or a lock that is taken, goes on with the thread's other tasks handed to
//! another thread (`block_in_place`).

use std::sync::mpsc::{Receiver, RecvError, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// How long a call waits on a thread of the caller's runtime before the thread's other tasks
/// are handed to another thread for the rest of the wait.
pub const PATIENCE: Duration = Duration::from_millis(10);

/// Waits for the answer `rx` brings (of work another thread or runtime does). A prompt answer
/// costs nothing more than the wait; past [`PATIENCE`], the wait goes on [`off_the_runtime`].
pub fn wait<T>(rx: &Receiver<T>) -> Result<T, RecvError> {
    match rx.recv_timeout(PATIENCE) {
        Ok(answer) => Ok(answer),
        Err(RecvTimeoutError::Disconnected) => Err(RecvError),
        Err(RecvTimeoutError::Timeout) => off_the_runtime(|| rx.recv()),
    }
}

/// Takes `m`: in place when it is free or freed within a brief spin (most locks are held for
/// moments), else waiting for it [`off_the_runtime`] (it may be held across a call to a
/// database that does not answer). A lock a holder's panic left poisoned is taken all the
/// same: what it guards is plain data, still usable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    for _ in 0..SPINS {
        match m.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    off_the_runtime(|| m.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// How many times [`lock`] tries a taken lock again before it waits off the runtime (as many
/// as the standard library's own mutex spins before it sleeps).
const SPINS: usize = 100;

/// Runs `blocking` on this thread, the thread's other tasks handed to another thread meanwhile
/// when this is a worker of a multi-threaded tokio runtime; as it is anywhere else (no runtime,
/// a blocking thread, or a single-threaded runtime, which has no other thread to hand them to).
pub fn off_the_runtime<R>(blocking: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(blocking)
        }
        _ => blocking(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Whether a task spawned on `rt` runs within a second, while what `hold` started holds
    /// the runtime's one thread; then `release` lets that go.
    fn another_task_runs(rt: &tokio::runtime::Runtime, release: impl FnOnce()) -> bool {
        // The task that waits is on the runtime's thread by now.
        std::thread::sleep(Duration::from_millis(50));
        let (ran, told) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = ran.send(());
        });
        let answered = told.recv_timeout(Duration::from_secs(1)).is_ok();
        release();
        answered
    }

    /// A multi-threaded runtime of one thread.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_task_waiting_long_for_an_answer_leaves_the_runtime_to_the_other_tasks() {
        let rt = runtime();
        let (tx, rx) = std::sync::mpsc::sync_channel::<u8>(1);
        let waiting = rt.spawn(async move { wait(&rx) });
        assert!(another_task_runs(&rt, || tx.send(1).unwrap()));
        assert_eq!(rt.block_on(waiting).unwrap(), Ok(1));
    }

    #[test]
    fn a_task_waiting_for_a_taken_lock_leaves_the_runtime_to_the_other_tasks() {
        let rt = runtime();
        let m = Arc::new(Mutex::new(0));
        let held = lock(&m);
        let m2 = m.clone();
        let waiting = rt.spawn(async move { *lock(&m2) + 1 });
        assert!(another_task_runs(&rt, || drop(held)));
        assert_eq!(rt.block_on(waiting).unwrap(), 1);
    }

    #[test]
    fn waits_in_place_where_no_thread_can_take_over() {
        // No runtime, and a single-threaded one: the wait happens in place, without a panic.
        let answer = |n: u8| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                tx.send(n).unwrap();
            });
            rx
        };
        assert_eq!(wait(&answer(7)), Ok(7));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let rx = answer(8);
        assert_eq!(rt.block_on(async { wait(&rx) }), Ok(8));
        let m = Mutex::new(9);
        std::thread::scope(|s| {
            let (taken, told) = std::sync::mpsc::channel();
            let m = &m;
            s.spawn(move || {
                let _held = m.lock().unwrap();
                taken.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(30));
            });
            told.recv().unwrap();
            assert_eq!(rt.block_on(async { *lock(m) }), 9);
        });
    }
}
