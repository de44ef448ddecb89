//! Proposals on their way into the log: each command (or a group submitted together) waits in a queue with where its
//! answer goes, and one task packs what waits into entries while earlier entries are being committed, so that one
//! fsync on each node commits many commands.

use std::sync::Arc;
#[cfg(madsim)]
use std::sync::Mutex;

use cellog_core::{Command, Millis};
use openraft::error::ClientWriteError;
use tokio::sync::{mpsc, oneshot};

#[cfg(madsim)]
use crate::state_machine::Replica;
use crate::types::{ProposeError, ProposeResult, Proposers, Raft, Request, Response, Waiting};

/// Most commands packed into one log entry.
pub const MAX_BATCH: usize = 1024;
/// Entries being committed at once by one node. More than one trades bigger entries for overlap; on two cores,
/// `scripts/bench` measured 4 in flight slower for pipelined publish (R1 59k against 82k msgs/s, R3 no better), since
/// each entry cost an fsync and its own replication round. With appends synced in groups (see
/// [`crate::log_store`]) an entry no longer costs an fsync of its own, yet 2 and 4 in flight still measured no faster
/// (R1 91k and 82k against 96k msgs/s, R3 36k and 35k against 38k): each costs its own replication round and apply.
/// Once a `PublishBatch` request carried many messages, 2 in flight measured no faster at R1 again (publish 66k to 74k
/// against 61k to 74k in four rounds) and slower for consume (70k to 87k against 78k to 99k), though R3 publish and
/// consume gained up to 15 %. Once an entry's place was freed as it is applied (its proposers answered there), the
/// next entry's append and sync overlap the last one's apply: `scripts/bench 200000 256`, 2 against 1 in flight, three
/// interleaved rounds, R1 publish 148/132/137k against 136/118/141k msgs/s, R1 consume 162/156/168k against
/// 158/144/166k, R3 publish 58/57/58k against 57/48/57k, R3 consume 69/68/76k against 67/67/68k, sync even.
pub const ENTRIES_IN_FLIGHT: usize = 2;
/// An entry takes no more proposals once their encoded sizes reach this many bytes, so an entry's commands take at
/// most this plus one command or one group submitted together (each at most [`cellog_core::MAX_COMMAND_BYTES`]): about
/// 13 MiB, and at most twice [`MAX_BATCH`] commands.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Most proposals waiting for the next entry; proposers wait for room beyond that.
pub(crate) const PROPOSAL_QUEUE: usize = 16 * MAX_BATCH;

/// Commands waiting to be packed into an entry, each with where its answer goes: one command, or a group submitted
/// together, which always shares one entry.
pub(crate) struct Proposal {
    at: Millis,
    first: (Command, oneshot::Sender<ProposeResult>),
    /// The rest of a group, in order (empty for one command, and then not allocated).
    rest: Vec<(Command, oneshot::Sender<ProposeResult>)>,
    /// The commands' encoded size, which bounds the entry they go into.
    size: usize,
}

impl Proposal {
    pub(crate) fn one(at: Millis, command: Command, size: usize, reply: oneshot::Sender<ProposeResult>) -> Self {
        Proposal { at, first: (command, reply), rest: Vec::new(), size }
    }

    /// The group of `commands`, in order, if there are any.
    pub(crate) fn group(
        at: Millis,
        commands: Vec<(Command, oneshot::Sender<ProposeResult>)>,
        size: usize,
    ) -> Option<Self> {
        let mut commands = commands.into_iter();
        let first = commands.next()?;
        Some(Proposal { at, first, rest: commands.collect(), size })
    }

    fn len(&self) -> usize {
        1 + self.rest.len()
    }
}

/// Packs waiting proposals into entries: while entries are being committed, the next proposals gather, so one fsync
/// on each node commits many commands. Up to [`ENTRIES_IN_FLIGHT`] entries are committed at once (pipelining); they
/// are handed to Raft one after another from this one task, so the log keeps the order the proposals arrived in.
pub(crate) async fn pack_proposals(
    raft: Raft,
    mut queue: mpsc::Receiver<Proposal>,
    #[cfg(madsim)] replica: Arc<Mutex<Replica>>,
) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(ENTRIES_IN_FLIGHT));
    // The last time stamped on an entry: proposals are stamped when submitted, and one submitted earlier may be packed
    // later, so an entry never carries a time before the previous entry's.
    let mut last_at = Millis::ZERO;
    while let Some(first) = queue.recv().await {
        // Wait for room before draining the queue, so that the batch grows while the pipeline is full.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let (mut bytes, mut n_commands) = (first.size, first.len());
        let mut batch = vec![first];
        // A group is never split, so an entry may pass these bounds by one group (bounded in `CellNode::submit_all`).
        while n_commands < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            match queue.try_recv() {
                Ok(proposal) => {
                    bytes += proposal.size;
                    n_commands += proposal.len();
                    batch.push(proposal);
                }
                Err(_) => break,
            }
        }
        let at = batch.iter().map(|proposal| proposal.at).max().expect("a batch has a first proposal");
        #[cfg(madsim)]
        let at =
            if cellog_planted::active(cellog_planted::Mutant::LeaderTimeNotMonotonic) { at } else { at.max(last_at) };
        #[cfg(not(madsim))]
        let at = at.max(last_at);
        last_at = at;
        let (commands, replies): (Vec<Command>, Vec<oneshot::Sender<ProposeResult>>) =
            batch.into_iter().flat_map(|proposal| std::iter::once(proposal.first).chain(proposal.rest)).unzip();
        #[cfg(madsim)]
        let stale = cellog_planted::active(cellog_planted::Mutant::StaleLeaderWrite)
            .then(|| (commands.clone(), replica.clone()));
        // The proposers are answered by whichever comes first: the state machine as it applies the entry on this node
        // (the entry in memory carries them), or Raft's answer to the proposal (a proposal refused, leadership lost, or
        // an entry applied after it was read back from the store).
        let waiting = Waiting::new(Proposers { replies, in_flight: permit });
        let committed =
            raft.client_write_ff(Request { at, commands, waiting: waiting.clone(), placed: Default::default() }).await;
        tokio::spawn(async move {
            let answered = match committed {
                Err(fatal) => Err(fatal.to_string()),
                Ok(answer) => Ok(answer.await),
            };
            let Some(proposers) = waiting.take() else { return };
            match answered {
                Err(fatal) => proposers.fail(ProposeError::Raft(fatal)),
                Ok(Ok(Ok(response))) => match response.data {
                    Response::Applied(results) => proposers.answer(results),
                    Response::Halted { index } => proposers.fail(ProposeError::halted_in_log(index)),
                    Response::Skipped { index, term } => proposers.fail(ProposeError::EntrySkipped { index, term }),
                    other => proposers
                        .fail(ProposeError::Raft(format!("{n_commands} commands were answered with {other:?}"))),
                },
                Ok(Ok(Err(ClientWriteError::ForwardToLeader(forward)))) => {
                    #[cfg(madsim)]
                    if let Some((commands, replica)) = stale {
                        let mut replica = replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                        let mut results = Vec::with_capacity(commands.len());
                        for command in commands {
                            results.push(replica.cell.apply(at, command));
                            replica.cell.drain_work().for_each(drop);
                            replica.cell.drain_transitions().for_each(drop);
                        }
                        return proposers.answer(results);
                    }
                    let leader = forward.leader_id.zip(forward.leader_node);
                    proposers.fail(ProposeError::LeaderChanged { leader });
                }
                Ok(Ok(Err(error))) => proposers.fail(ProposeError::Raft(error.to_string())),
                Ok(Err(_)) => proposers.fail(ProposeError::Raft("raft stopped before answering".to_string())),
            }
        });
    }
}
