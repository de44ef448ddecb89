//! State transitions as `tracing` events under the target [`TARGET`]: what each applied entry did, what its effects
//! were, and each change of a node's role, term, leader, membership, snapshot and purged log.
//!
//! Operators see them in the log (role, membership and snapshot changes at INFO, applied entries at DEBUG); the
//! simulator collects them into its trace. Fields hold only log positions, cell time, names and counts: no addresses
//! and no wall-clock readings, so the same run gives the same events.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cellog_core::{Grants, Millis, Outcome, Rejection, Transition};
use openraft::{Membership, ServerState};

use crate::types::{NodeAddrs, NodeId, Raft};

/// The `tracing` target of every transition event.
pub const TARGET: &str = cellog_core::TRANSITIONS;

/// Whether applied entries are being traced (so their summaries are worth building).
pub(crate) fn tracing_entries() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// `kind×count` for each kind, in order of first appearance: `publish×48 ack×2`.
fn counted<'a>(kinds: impl IntoIterator<Item = &'a str>) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for kind in kinds {
        match counts.iter_mut().find(|(seen, _)| *seen == kind) {
            Some((_, count)) => *count += 1,
            None => counts.push((kind, 1)),
        }
    }
    let mut text = String::new();
    for (kind, count) in counts {
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "{kind}×{count}");
    }
    text
}

fn outcome_kind(result: &Result<Outcome, Rejection>) -> &'static str {
    match result {
        Ok(Outcome::Published(ack)) if ack.duplicate => "duplicate",
        Ok(outcome) => outcome.into(),
        Err(rejection) => rejection.into(),
    }
}

/// The kinds a result shows: its own, or for a batch of acks each ack's (`acked`, or why it was refused).
fn outcome_kinds(result: &Result<Outcome, Rejection>) -> Vec<&'static str> {
    match result {
        Ok(Outcome::AckedEach(answers)) => answers
            .iter()
            .map(|answer| answer.as_ref().map_or_else(|rejection| rejection.into(), |_| "acked"))
            .collect(),
        other => vec![outcome_kind(other)],
    }
}

/// One applied entry of commands: their kinds going in and their results coming out.
pub(crate) fn applied(index: u64, at: Millis, commands: &[&'static str], results: &[Result<Outcome, Rejection>]) {
    tracing::debug!(
        target: TARGET,
        index,
        at = at.0,
        commands = %counted(commands.iter().copied()),
        results = %counted(results.iter().flat_map(outcome_kinds)),
        "apply"
    );
}

/// One applied membership change.
pub(crate) fn membership(index: u64, membership: &Membership<NodeId, NodeAddrs>) {
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let learners: Vec<NodeId> = membership.learner_ids().collect();
    tracing::info!(target: TARGET, index, ?voters, ?learners, "membership");
}

/// Sequences `first..=last` written `first-last`, or `first` alone.
fn span(first: u64, last: u64) -> String {
    if first == last { first.to_string() } else { format!("{first}-{last}") }
}

/// Partitions by member, `a:0,2 b:1`.
fn owners(pairs: &[(std::sync::Arc<str>, u32)]) -> String {
    let mut by_member: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (member, partition) in pairs {
        by_member.entry(member).or_default().push(partition.to_string());
    }
    by_member
        .iter()
        .map(|(member, partitions)| format!("{member}:{}", partitions.join(",")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// (what, stream, partition) → runs of consecutive sequences, `(first, last)`.
type Runs = BTreeMap<(&'static str, String, u32), Vec<(u64, u64)>>;

/// The effects of one entry. Appends and removals are folded into runs of sequences per partition; every other effect
/// is an event of its own.
pub(crate) fn effects<'a>(index: u64, effects: impl IntoIterator<Item = &'a Transition>) {
    let mut runs = Runs::new();
    let mut extend = |what: &'static str, stream: &str, partition: u32, seq: u64| {
        let runs = runs.entry((what, stream.to_string(), partition)).or_default();
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == seq => *last = seq,
            _ => runs.push((seq, seq)),
        }
    };
    for effect in effects {
        match effect {
            Transition::Appended { stream, partition, seq } => extend("appended", stream, *partition, *seq),
            Transition::Removed { stream, partition, seq, reason } => {
                extend(<&'static str>::from(reason), stream, *partition, *seq);
            }
            Transition::Recalled { stream, partition, seq } => {
                tracing::debug!(target: TARGET, index, %stream, partition, seq, "recalled");
            }
            Transition::DeliveryExpired { stream, consumer, partition, seq, delivery_count } => {
                tracing::debug!(target: TARGET, index, %stream, %consumer, partition, seq, delivery_count, "expired");
            }
            Transition::DeadLettered { stream, consumer, partition, seq, delivery_count, copy } => {
                let copy = copy.as_ref().map_or("none".to_string(), |(dl, p, s)| format!("{dl}/{p}:{s}"));
                tracing::debug!(
                    target: TARGET, index, %stream, %consumer, partition, seq, delivery_count, %copy, "dead-lettered"
                );
            }
            Transition::TransactionCommitted { producer_id, epoch, n_messages } => {
                tracing::debug!(target: TARGET, index, producer_id, epoch, n_messages, "txn-committed");
            }
            Transition::TransactionAborted { producer_id, epoch, reason } => {
                let reason: &'static str = reason.into();
                tracing::debug!(target: TARGET, index, producer_id, epoch, reason, "txn-aborted");
            }
            Transition::ProducerExpired { producer_id, transactional_id } => {
                tracing::debug!(target: TARGET, index, producer_id, %transactional_id, "producer-expired")
            }
            Transition::StreamDeleted { stream } => tracing::debug!(target: TARGET, index, %stream, "stream-deleted"),
            Transition::Granted { principal, grants } => {
                let Grants { publish, subscribe, consume, admin, cluster_admin } = grants;
                tracing::info!(
                    target: TARGET, index, %principal, ?publish, ?subscribe, ?consume, admin, cluster_admin, "granted"
                );
            }
            Transition::PrincipalDeleted { principal } => {
                tracing::info!(target: TARGET, index, %principal, "principal-deleted");
            }
            Transition::TokenAdded { principal, token } => {
                tracing::info!(target: TARGET, index, %principal, %token, "token-added");
            }
            Transition::TokenRevoked { principal, token } => {
                tracing::info!(target: TARGET, index, %principal, %token, "token-revoked");
            }
            Transition::GroupChanged { stream, group, generation, member, change, granted, revoking, released } => {
                let change: &'static str = change.into();
                let granted = owners(granted);
                let revoking = owners(revoking);
                tracing::debug!(
                    target: TARGET, index, %stream, %group, generation, %member, change, %granted, %revoking,
                    ?released, "group"
                );
            }
        }
    }
    for ((what, stream, partition), runs) in runs {
        let seqs = runs.iter().map(|&(first, last)| span(first, last)).collect::<Vec<_>>().join(",");
        if what == "appended" {
            tracing::debug!(target: TARGET, index, %stream, partition, %seqs, "appended");
        } else {
            tracing::debug!(target: TARGET, index, %stream, partition, %seqs, reason = what, "removed");
        }
    }
}

fn state_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// Reports a node's role, term and leader when they change, and each new snapshot and log purge.
///
/// It looks at the metrics when asked (the node's tick loop asks every time it wakes) rather than waiting on
/// openraft's metrics channel: tokio's `watch` wakes its waiters in an order drawn from a thread-local generator
/// outside the simulator's control, so a second waiter on that channel makes a simulated run irreproducible.
#[derive(Debug, Default)]
pub(crate) struct Observer {
    role: Option<(ServerState, u64, Option<NodeId>)>,
    snapshot: Option<u64>,
    purged: Option<u64>,
}

impl Observer {
    /// Reports what changed since the last look.
    pub(crate) fn look(&mut self, raft: &Raft) {
        let (role, snapshot, purged) = {
            let metrics = raft.metrics();
            let now = metrics.borrow();
            let role = (now.state, now.current_term, now.current_leader);
            (role, now.snapshot.map(|log_id| log_id.index), now.purged.map(|log_id| log_id.index))
        };
        if self.role != Some(role) {
            self.role = Some(role);
            let (state, term, leader) = role;
            let leader = leader.map_or_else(|| "none".to_string(), |id| id.to_string());
            tracing::info!(target: TARGET, state = state_name(state), term, %leader, "role");
        }
        if snapshot != self.snapshot {
            self.snapshot = snapshot;
            if let Some(index) = snapshot {
                tracing::info!(target: TARGET, index, "snapshot");
            }
        }
        if purged != self.purged {
            self.purged = purged;
            if let Some(up_to) = purged {
                tracing::debug!(target: TARGET, up_to, "purged");
            }
        }
    }
}

/// The node refused a client's command before proposing it: its credential names no principal, or the principal's
/// grants do not allow it. Nothing reached the log.
pub fn refused(command: &'static str, rejection: &Rejection) {
    let reason: &'static str = rejection.into();
    tracing::info!(target: TARGET, command, reason, detail = %rejection, "refused");
}

/// The node took its cell's id: `how` it came by it ("made" founding the cell, "learned" from a leader).
pub fn cell_id(id: impl std::fmt::Display, how: &'static str) {
    tracing::info!(target: TARGET, %id, how, "cell-id");
}

/// The log kept behind the snapshot is over its byte budget: the node asks for it to be purged up to `up_to`.
pub fn kept_log_over_budget(up_to: u64, budget: u64) {
    tracing::debug!(target: TARGET, up_to, budget, "kept-log-over-budget");
}

/// A message body this node's disk damaged was written again from peer `from`'s copy, which verified against the
/// reference in this node's state.
pub fn body_repaired(key: u64, from: NodeId) {
    tracing::info!(target: TARGET, key, from, "body-repaired");
}

/// The log applied since the snapshot passed its byte budget: the node asked for a snapshot at `applied`.
pub fn snapshot_asked_for(applied: u64, budget: u64) {
    tracing::debug!(target: TARGET, applied, budget, "snapshot-asked-for");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keep_the_order_kinds_first_appear_in() {
        assert_eq!(counted(["publish", "ack", "publish"]), "publish×2 ack×1");
        assert_eq!(counted([]), "");
    }

    #[test]
    fn a_batch_of_acks_shows_each_ack_s_result() {
        use cellog_core::{AckAnswer, AckState};
        let acked = Ok(AckAnswer { state: AckState::Applied, already_done: false });
        let refused = Err(Rejection::NotDelivered { partition: 0, seq: 9 });
        let results = [Ok(Outcome::AckedEach(vec![acked.clone(), refused, acked])), Ok(Outcome::Ticked)];
        assert_eq!(counted(results.iter().flat_map(outcome_kinds)), "acked×2 not-delivered×1 ticked×1");
    }

    #[test]
    fn runs_are_written_compactly() {
        assert_eq!(span(3, 3), "3");
        assert_eq!(span(3, 9), "3-9");
    }
}
