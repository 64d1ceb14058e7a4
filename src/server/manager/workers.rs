//! How many runs execute at once (`runner serve --workers N`, LangGraph's `N_JOBS_PER_WORKER`):
//! a run takes a worker before its engine starts and gives it back when the engine ends. A run
//! created while every worker is busy stays `pending` and gets the next free worker in the order
//! the runs were created: the queue is entered when the run's row is written, not when its task
//! first runs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::lock;

/// The free workers and the runs waiting for one, oldest first.
#[derive(Debug)]
struct Queue {
    free: usize,
    waiting: VecDeque<oneshot::Sender<Worker>>,
}

/// The server's workers.
#[derive(Debug, Clone)]
pub(crate) struct Workers {
    queue: Arc<Mutex<Queue>>,
    size: usize,
}

impl Workers {
    /// `size` workers (at least one: a server that runs nothing would only queue).
    pub(crate) fn new(size: usize) -> Workers {
        let size = size.max(1);
        Workers {
            queue: Arc::new(Mutex::new(Queue {
                free: size,
                waiting: VecDeque::new(),
            })),
            size,
        }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// A place in line for a worker: the worker itself at once if one is free and nobody waits.
    pub(crate) fn enter(&self) -> Turn {
        let mut q = lock(&self.queue);
        if q.free > 0 && q.waiting.is_empty() {
            q.free -= 1;
            return Turn::Now(Worker {
                queue: Some(self.queue.clone()),
            });
        }
        let (tx, rx) = oneshot::channel();
        q.waiting.push_back(tx);
        Turn::Queued(rx)
    }
}

/// A run's place in line.
#[derive(Debug)]
pub(crate) enum Turn {
    Now(Worker),
    Queued(oneshot::Receiver<Worker>),
}

impl Turn {
    /// The run's worker, once the runs before it have theirs. Dropping the turn (a run cancelled
    /// while it waits) leaves the line; a worker handed to it meanwhile goes to the next run.
    pub(crate) async fn worker(self) -> Worker {
        match self {
            Turn::Now(w) => w,
            Turn::Queued(rx) => match rx.await {
                Ok(w) => w,
                // Every sender is held by the queue until it hands a worker over, and the queue
                // lives as long as any worker or turn: a dropped sender is never seen.
                Err(_) => Worker { queue: None },
            },
        }
    }
}

/// A worker a run holds; dropped, it goes to the oldest run waiting, else it is free.
#[derive(Debug)]
pub(crate) struct Worker {
    /// None once handed on (or for a worker that counts for nothing).
    queue: Option<Arc<Mutex<Queue>>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let Some(queue) = self.queue.take() else { return };
        let mut q = lock(&queue);
        while let Some(next) = q.waiting.pop_front() {
            match next.send(Worker {
                queue: Some(queue.clone()),
            }) {
                Ok(()) => return,
                // That run left the line: the worker it was not given is handed on, not
                // dropped (dropping it here would take the lock held now).
                Err(mut refused) => refused.queue = None,
            }
        }
        q.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(w: &Workers) -> usize {
        lock(&w.queue).free
    }

    #[tokio::test]
    async fn workers_go_to_waiting_runs_in_the_order_they_came() {
        let workers = Workers::new(1);
        let first = workers.enter().worker().await;
        let second = workers.enter();
        let third = workers.enter();
        assert!(matches!(second, Turn::Queued(_)) && matches!(third, Turn::Queued(_)));
        assert_eq!(free(&workers), 0);
        // The third asks first: it still waits for the second.
        let third = tokio::spawn(third.worker());
        tokio::task::yield_now().await;
        drop(first);
        let second = second.worker().await;
        assert!(!third.is_finished());
        drop(second);
        let third = third.await.unwrap();
        assert_eq!(free(&workers), 0);
        drop(third);
        assert_eq!(free(&workers), 1);
    }

    #[tokio::test]
    async fn a_run_that_leaves_the_line_passes_its_worker_on() {
        let workers = Workers::new(1);
        let first = workers.enter().worker().await;
        let gone = workers.enter();
        let next = workers.enter();
        drop(gone);
        drop(first);
        let next = next.worker().await;
        assert_eq!(free(&workers), 0);
        drop(next);
        assert_eq!(free(&workers), 1, "no worker is lost");
        // A newcomer does not pass a run already waiting.
        let held = workers.enter().worker().await;
        let waiting = workers.enter();
        drop(held);
        assert!(matches!(workers.enter(), Turn::Queued(_)));
        drop(waiting);
    }
}
