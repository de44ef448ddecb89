//! The one door into a cell: a command is admitted once, under one look at the replica (the caller's principal
//! authorized, what every replica would check checked, its encoded size measured, the node's time stamped), and only
//! an admitted command is submitted to Raft.
//!
//! The cell checks a command again as it applies it, and that check is the authority: this one keeps what the cell
//! would refuse from costing an entry and an fsync on every node, and the checks run once on the way in, not once per
//! step of it.

use std::sync::{Arc, MutexGuard};

use cellog_core::{Actor, Command, Millis, Rejection};
use tokio::sync::oneshot;

use crate::node::CellNode;
use crate::proposals::{MAX_BATCH, Proposal};
use crate::state_machine::{Interrupted, Replica};
use crate::storage::Storage;
use crate::transition;
use crate::types::{Answer, ProposeError, ProposeResult, stopping};

/// A command this node admitted: only [`Door`] makes one, and [`CellNode::submit`] takes nothing else.
#[derive(Debug)]
pub struct Admitted {
    at: Millis,
    command: Command,
    /// Its encoded size, which bounds the entry it goes into.
    size: usize,
    /// The principal it runs as; `None` for the node's own commands.
    principal: Option<Arc<str>>,
}

impl Admitted {
    /// The principal the command runs as (`None`: the node's own).
    pub fn principal(&self) -> Option<&Arc<str>> {
        self.principal.as_ref()
    }

    /// The subject of a publish, or of a caller's publish.
    pub fn subject(&self) -> Option<&str> {
        match &self.command {
            Command::As { command, .. } => match command.as_ref() {
                Command::Publish(request) => Some(request.subject.as_str()),
                _ => None,
            },
            Command::Publish(request) => Some(request.subject.as_str()),
            _ => None,
        }
    }
}

/// The door open: the replica held for one look, and the time its commands are stamped with. Held briefly (applying
/// waits for it), and never across an await.
pub struct Door<'a> {
    replica: MutexGuard<'a, Replica>,
    at: Millis,
}

impl Door<'_> {
    /// `command` run as `actor`, if the actor's credential and grants allow it and the cell would take it (its names,
    /// subjects, ids and size); a refusal is recorded as the node's transition and answered as the cell would.
    pub fn admit(&self, actor: &Actor, command: Command) -> Result<Admitted, Rejection> {
        let kind = command.kind();
        let admitted = self.replica.cell.authorize_command(actor, &command).and_then(|principal| {
            let command = Command::As { actor: actor.clone(), command: Box::new(command) };
            let size = checked_size(&command)?;
            Ok(Admitted { at: self.at, command, size, principal: Some(principal) })
        });
        admitted.inspect_err(|rejection| transition::refused(kind, rejection))
    }

    /// `command` on the node's own authority (sealed mail's rows, a mirror's copies, the root token), if the cell
    /// would take it.
    pub fn own(&self, command: Command) -> Result<Admitted, Rejection> {
        let size = checked_size(&command)?;
        Ok(Admitted { at: self.at, command, size, principal: None })
    }
}

/// A command's encoded size, or the rejection every replica would give it (a bad name, subject or id, or too many
/// bytes): what is refused here never reaches the log.
fn checked_size(command: &Command) -> Result<usize, Rejection> {
    command.check().and_then(|()| command.check_size())
}

/// Whether `command` grows what the store holds (what a full disk refuses): a publish, a copy into a stream, a new
/// stream. The rest (acks, deletes, recalls, membership) is small, and some of it frees room.
fn grows_store(command: &Command) -> bool {
    match command {
        Command::As { command, .. } => grows_store(command),
        Command::Publish(_)
        | Command::Ingest { .. }
        | Command::MirrorIngest { .. }
        | Command::CreateStream { .. }
        | Command::CreateMirror { .. }
        | Command::ReceiveStream { .. } => true,
        _ => false,
    }
}

impl<S: Storage + Clone> CellNode<S> {
    /// Opens the door: one look at the replica for the commands admitted through it, stamped with this node's clock
    /// (never earlier than the cell's last stamp). Refused once a panic interrupted applying.
    pub fn door(&self) -> Result<Door<'_>, Interrupted> {
        let replica = self.replica()?;
        let at = self.clock.now(replica.cell.last_at());
        Ok(Door { replica, at })
    }

    /// Proposes a command on the node's own authority, stamped with this node's clock, and waits until it is
    /// committed and applied. A command the cell would refuse is answered with its refusal and never proposed.
    pub async fn propose_now(&self, command: Command) -> ProposeResult {
        let admitted = self.door().map_err(|interrupted| ProposeError::Raft(interrupted.to_string()))?.own(command);
        match admitted {
            Ok(admitted) => self.propose(admitted).await,
            Err(rejection) => Ok(Err(rejection)),
        }
    }

    /// Proposes an admitted command and waits until it is committed and applied. Proposals made while an entry is
    /// being committed share the next entry.
    pub async fn propose(&self, admitted: Admitted) -> ProposeResult {
        self.submit(admitted).await?.wait().await
    }

    /// Queues an admitted command for the next entry (waiting for room in the queue), and returns its answer to wait
    /// for. Commands submitted one after another are applied in that order, so a caller can pipeline many and still
    /// know their order in the log.
    pub async fn submit(&self, admitted: Admitted) -> Result<Answer, ProposeError> {
        // Refused here, a command certainly never reaches the log; refused by Raft, it might have.
        self.check_applying()?;
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        if grows_store(&admitted.command) {
            self.check_room()?;
        }
        let (reply, answer) = oneshot::channel();
        let Admitted { at, command, size, .. } = admitted;
        self.proposals.send(Proposal::one(at, command, size, reply)).await.map_err(|_| stopping())?;
        Ok(Answer(answer))
    }

    /// Queues admitted commands for the next entries as groups, in their order: a group shares one entry, so a
    /// call's many commands (a batch of publishes, the acks of a fetch) cost one replication round and not one each. A
    /// group holds at most [`MAX_BATCH`] commands of at most [`cellog_core::MAX_COMMAND_BYTES`] together; more make
    /// several groups, queued one after another. One answer per command, in order. `Err` if nothing was queued (this
    /// node does not lead, or it is stopping); a later group that could not be queued answers each of its commands that
    /// the node is stopping.
    pub async fn submit_all(&self, admitted: Vec<Admitted>) -> Result<Vec<Answer>, ProposeError> {
        let Some(at) = admitted.iter().map(|admitted| admitted.at).max() else { return Ok(Vec::new()) };
        self.check_applying()?;
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        if admitted.iter().any(|admitted| grows_store(&admitted.command)) {
            self.check_room()?;
        }
        let mut answers = Vec::with_capacity(admitted.len());
        let mut groups = Vec::new();
        let mut group = Vec::with_capacity(admitted.len().min(MAX_BATCH));
        let mut size = 0;
        for Admitted { command, size: bytes, .. } in admitted {
            if group.len() == MAX_BATCH || (!group.is_empty() && size + bytes > cellog_core::MAX_COMMAND_BYTES) {
                groups.extend(Proposal::group(at, std::mem::take(&mut group), std::mem::take(&mut size)));
            }
            let (reply, answer) = oneshot::channel();
            size += bytes;
            group.push((command, reply));
            answers.push(Answer(answer));
        }
        groups.extend(Proposal::group(at, group, size));
        for (n, proposal) in groups.into_iter().enumerate() {
            if self.proposals.send(proposal).await.is_err() {
                // The groups not queued are dropped with their replies, so their answers say the node is stopping.
                if n == 0 {
                    return Err(stopping());
                }
                break;
            }
        }
        Ok(answers)
    }
}
