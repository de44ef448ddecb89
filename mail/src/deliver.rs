//! The delivery loop: while this node leads, it walks the outbox and delivers each envelope to each recipient without
//! a result. What to try and when is decided by the schedule ([`crate::outbox::Outbox`]); this loop only runs the
//! attempts, each a task of its own (up to [`PARALLEL_ATTEMPTS`] at once) bounded by
//! [`crate::RetryPolicy::attempt_timeout`] and settled as it ends, so a recipient that does not answer holds back no
//! other.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::cell::MailCell;
use crate::outbox::Attempt;
use crate::room::{Mailroom, lock};

/// Most delivery attempts made at once by one leader.
pub const PARALLEL_ATTEMPTS: usize = 64;

/// How an attempt ended, with the leadership it was started under, its outbox sequence and recipient.
type Ended = (u64, u64, String, Attempt);

/// While this node leads, delivers the outbox (see the module's documentation). Runs until `stopped`.
#[allow(
    clippy::disallowed_methods,
    reason = "retries are scheduled on the runtime's clock, which the simulator drives"
)]
pub async fn deliver_loop<C: MailCell>(mail: Arc<Mailroom>, cell: Arc<C>, mut stopped: watch::Receiver<bool>) {
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel::<Ended>();
    let mut flights: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // Attempts started under an earlier leadership of this node are ignored when they end.
    let mut term = 0u64;
    let mut leading = false;
    loop {
        if *stopped.borrow() {
            flights.iter().for_each(tokio::task::JoinHandle::abort);
            return;
        }
        flights.retain(|flight| !flight.is_finished());
        let mut next_wake = Instant::now() + mail.retry.poll;
        if !cell.is_leader() {
            if leading {
                // Whoever leads next starts over from the outbox and the results.
                flights.drain(..).for_each(|flight| flight.abort());
                lock(&mail.outbox).clear();
                leading = false;
            }
        } else if !leading && mail.ensure_streams(&*cell).await.is_err() {
            // Leadership may have just moved; try again on the next round.
        } else {
            if !leading {
                term += 1;
                leading = true;
            }
            mail.scan(&*cell);
            let room = PARALLEL_ATTEMPTS.saturating_sub(flights.len());
            let starts = lock(&mail.outbox).due(Instant::now(), room);
            for start in starts {
                let (mail, cell, tx) = (mail.clone(), cell.clone(), ended_tx.clone());
                flights.push(tokio::spawn(async move {
                    let attempt = mail.attempt(&*cell, &start.recipient, start.bytes).await;
                    let _ = tx.send((term, start.seq, start.recipient, attempt));
                }));
            }
            if let Some(due) = lock(&mail.outbox).next_wake() {
                next_wake = next_wake.min(due);
            }
        }
        // `biased`: branches are polled in this order, never in an order drawn at random, so a simulated run repeats.
        tokio::select! {
            biased;
            Some((started, seq, recipient, attempt)) = ended_rx.recv() => {
                if leading && started == term {
                    mail.settle(&*cell, seq, recipient, attempt).await;
                }
            }
            _ = tokio::time::sleep_until(next_wake) => {}
            _ = mail.wake.notified() => {}
            changed = stopped.changed() => {
                // The node is stopping, or was dropped without a stop.
                if changed.is_err() {
                    flights.iter().for_each(tokio::task::JoinHandle::abort);
                    return;
                }
            }
        }
    }
}
