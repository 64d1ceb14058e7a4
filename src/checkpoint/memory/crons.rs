//! The in-memory [`CronStore`]: crons and webhook deliveries in maps under one lock.

use std::collections::BTreeMap;

use super::MemoryCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::crons::{Attempt, CronRow, CronStore, Delivery, DeliveryState};

/// A delivery, in the order it was first stored, and who holds it until when.
type Held = (u64, Delivery, Option<(String, i64)>);

/// The in-memory store's crons and deliveries, each in the order it was first stored.
#[derive(Debug, Default)]
pub(super) struct Memory {
    crons: BTreeMap<String, (u64, CronRow)>,
    deliveries: BTreeMap<String, Held>,
    /// Orders rows by their first storing.
    seq: u64,
}

impl Memory {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Deletes the crons that run on thread `thread_id`.
    pub(super) fn delete_for_thread(&mut self, thread_id: &str) {
        self.crons.retain(|_, (_, c)| c.thread_id.as_deref() != Some(thread_id));
    }
}

impl CronStore for MemoryCheckpointer {
    fn put_cron(&self, cron: &CronRow) -> Result<()> {
        let mut m = self.lock_crons()?;
        let seq = match m.crons.get(&cron.cron_id) {
            Some((seq, _)) => *seq,
            None => m.next(),
        };
        m.crons.insert(cron.cron_id.clone(), (seq, cron.clone()));
        Ok(())
    }

    fn insert_cron(&self, cron: &CronRow) -> Result<bool> {
        let mut m = self.lock_crons()?;
        if m.crons.contains_key(&cron.cron_id) {
            return Ok(false);
        }
        let seq = m.next();
        m.crons.insert(cron.cron_id.clone(), (seq, cron.clone()));
        Ok(true)
    }

    fn get_cron(&self, cron_id: &str) -> Result<Option<CronRow>> {
        Ok(self.lock_crons()?.crons.get(cron_id).map(|(_, c)| c.clone()))
    }

    fn list_crons(&self) -> Result<Vec<CronRow>> {
        let m = self.lock_crons()?;
        let mut rows: Vec<&(u64, CronRow)> = m.crons.values().collect();
        rows.sort_by_key(|(seq, _)| *seq);
        Ok(rows.into_iter().map(|(_, c)| c.clone()).collect())
    }

    fn delete_cron(&self, cron_id: &str) -> Result<bool> {
        Ok(self.lock_crons()?.crons.remove(cron_id).is_some())
    }

    fn due_crons(&self, now: i64) -> Result<Vec<CronRow>> {
        Ok(self
            .list_crons()?
            .into_iter()
            .filter(|c| c.enabled && c.next_run_at.is_some_and(|n| n <= now) && c.end_ms.is_none_or(|e| now < e))
            .collect())
    }

    fn claim_tick(&self, cron_id: &str, at: i64, next: Option<i64>, updated_at: &str) -> Result<bool> {
        let mut m = self.lock_crons()?;
        match m.crons.get_mut(cron_id) {
            Some((_, c)) if c.next_run_at == Some(at) => {
                c.next_run_at = next;
                c.updated_at = updated_at.to_owned();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn enqueue_delivery(&self, delivery: &Delivery) -> Result<()> {
        let mut m = self.lock_crons()?;
        match m.deliveries.get_mut(&delivery.delivery_id) {
            Some((_, d, _)) => {
                if d.attempts == 0 && d.state == DeliveryState::Pending {
                    d.body = delivery.body.clone();
                    d.updated_at = delivery.updated_at.clone();
                }
            }
            None => {
                let seq = m.next();
                m.deliveries
                    .insert(delivery.delivery_id.clone(), (seq, delivery.clone(), None));
            }
        }
        Ok(())
    }

    fn claim_deliveries(&self, now: i64, owner: &str, hold_until: i64, limit: usize) -> Result<Vec<Delivery>> {
        let runs = self.lock_runs()?;
        let mut m = self.lock_crons()?;
        let mut due: Vec<(u64, String)> = m
            .deliveries
            .values()
            .filter(|(_, d, held)| {
                d.state == DeliveryState::Pending
                    && d.next_attempt_at <= now
                    && held.as_ref().is_none_or(|(_, until)| *until < now)
                    && !runs.is_active(&d.run_id)
            })
            .map(|(seq, d, _)| (*seq, d.delivery_id.clone()))
            .collect();
        due.sort();
        let mut out = Vec::new();
        for (_, id) in due.into_iter().take(limit) {
            if let Some((_, d, held)) = m.deliveries.get_mut(&id) {
                *held = Some((owner.to_owned(), hold_until));
                out.push(d.clone());
            }
        }
        Ok(out)
    }

    fn record_attempt(&self, delivery_id: &str, owner: &str, attempt: &Attempt) -> Result<bool> {
        let mut m = self.lock_crons()?;
        match m.deliveries.get_mut(delivery_id) {
            Some((_, d, held)) if held.as_ref().is_some_and(|(o, _)| o == owner) => {
                d.state = attempt.state;
                d.attempts += 1;
                d.last_status = attempt.status;
                d.last_error = attempt.error.clone();
                d.next_attempt_at = attempt.next_attempt_at;
                d.updated_at = attempt.at.clone();
                *held = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn list_deliveries(&self, run_id: Option<&str>) -> Result<Vec<Delivery>> {
        let m = self.lock_crons()?;
        let mut rows: Vec<&Held> = m
            .deliveries
            .values()
            .filter(|(_, d, _)| run_id.is_none_or(|r| d.run_id == r))
            .collect();
        rows.sort_by_key(|(seq, _, _)| *seq);
        Ok(rows.into_iter().map(|(_, d, _)| d.clone()).collect())
    }
}
