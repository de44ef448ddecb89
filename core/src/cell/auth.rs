//! Commands run as a principal, and the commands that manage principals and tokens.

use std::sync::Arc;

use super::{Cell, PIN_HEADER};
use crate::auth::{Access, Actor, Grants, NODE_HEADER_PREFIX, SENDER_HEADER, TokenHash, is_node_header};
use crate::command::Command;
use crate::effect::Transition;
use crate::error::Rejection;
use crate::outcome::Outcome;
use crate::tenant::Scope;
use crate::time::Millis;

impl Cell {
    /// Runs `command` as `actor`: in stored names when the actor is a tenant's principal (see [`crate::tenant`]),
    /// refused as [`Cell::authorize_command`] refuses it, else with the sender stamped on what it publishes; the
    /// outcome or rejection comes back in the actor's terms. A refusal changes nothing.
    pub(super) fn run_as(&mut self, at: Millis, actor: &Actor, command: Command) -> Result<Outcome, Rejection> {
        let principal = self.auth.authenticate(actor)?;
        let scope = Scope::of(&principal);
        let mut command = scope.command_in(command);
        let result = self.authorize_stored(&principal, &command).and_then(|()| {
            if let Command::Publish(request) = &mut command {
                request.headers.insert(SENDER_HEADER.to_string(), principal.to_string());
            }
            self.dispatch(at, command)
        });
        let outcome = result.map_err(|rejection| scope.rejection_out(rejection))?;
        if let Outcome::ProducerInitialized(r) = &outcome {
            self.auth.own_producer(r.producer_id, principal.clone());
        }
        Ok(scope.outcome_out(outcome))
    }

    /// The principal `actor` is, if its grants allow `command` (in the actor's own terms) in this state; else the
    /// rejection. Changes nothing: a node asks its replica before proposing, so that a command refused for its
    /// credential or grants costs the log nothing, and the cell asks again when it applies the command, which decides.
    pub fn authorize_command(&self, actor: &Actor, command: &Command) -> Result<Arc<str>, Rejection> {
        let principal = self.auth.authenticate(actor)?;
        let scope = Scope::of(&principal);
        let decision = match scope.tenant() {
            None => self.authorize_stored(&principal, command),
            Some(_) => self.authorize_stored(&principal, &scope.command_in(command.clone())),
        };
        decision.map_err(|rejection| scope.rejection_out(rejection))?;
        Ok(principal)
    }

    /// Whether `principal`'s grants allow `command`, in stored names.
    fn authorize_stored(&self, principal: &str, command: &Command) -> Result<(), Rejection> {
        let auth = &self.auth;
        match command {
            Command::Publish(request) => {
                #[cfg(madsim)]
                let skip = cellog_planted::active(cellog_planted::Mutant::GrantCheckSkipped);
                #[cfg(not(madsim))]
                let skip = false;
                if !skip {
                    auth.authorize(principal, &Access::Publish(&request.subject))?;
                }
                if let Some(r) = request.transaction {
                    auth.authorize_producer(principal, r.producer_id)?;
                }
                if let Some(filter) = auth.reserved_for(&request.subject) {
                    return Err(reserved(principal, filter));
                }
                // The sender, a pin (which holds another stream's message against retention and recall) and a dead
                // letter's origin are the node's to write, in whatever case a reader folds them to.
                #[cfg(madsim)]
                let accepted = cellog_planted::active(cellog_planted::Mutant::NodeHeaderAccepted);
                #[cfg(not(madsim))]
                let accepted = false;
                if let Some(name) = request.headers.keys().find(|name| is_node_header(name) && !accepted) {
                    return Err(Rejection::PermissionDenied {
                        principal: principal.to_string(),
                        needs: format!(
                            "the node's own authority (headers named {NODE_HEADER_PREFIX}* in any case, such as \
                             {PIN_HEADER} and {SENDER_HEADER}, are the node's; the message carries {name:?})"
                        ),
                    });
                }
            }
            Command::Recall { stream, .. } | Command::DeleteStream { name: stream } => {
                auth.authorize(principal, &Access::Admin)?;
                let subjects = self.streams.get(stream.as_str()).map(|s| &s.config().subjects[..]).unwrap_or(&[]);
                if let Some(filter) = auth.reserved_overlap(subjects) {
                    return Err(reserved(principal, filter));
                }
            }
            // A stream change never touches the node's subjects: neither what the stream claims before nor after,
            // nor a dead-letter stream that does (a dead letter is a write into it).
            Command::CreateStream { name, config } | Command::UpdateStream { name, config } => {
                auth.authorize(principal, &Access::Admin)?;
                let claimed = |stream: &str| self.streams.get(stream).map_or(&[][..], |s| &s.config().subjects[..]);
                let before = match command {
                    Command::UpdateStream { .. } => claimed(name),
                    _ => &[],
                };
                let dead_letters = config.dead_letter_stream.as_deref().map_or(&[][..], claimed);
                for subjects in [&config.subjects[..], before, dead_letters] {
                    if let Some(filter) = auth.reserved_overlap(subjects) {
                        return Err(reserved(principal, filter));
                    }
                }
            }
            Command::CreateConsumer { .. }
            | Command::UpdateConsumer { .. }
            | Command::DeleteConsumer { .. }
            | Command::RegisterPeer { .. }
            | Command::PeerProgress { .. }
            | Command::UnregisterPeer { .. } => auth.authorize(principal, &Access::Admin)?,
            Command::Fetch { stream, consumer, .. }
            | Command::Ack { stream, consumer, .. }
            | Command::Acks { stream, consumer, .. }
            | Command::CommitCursor { stream, consumer, .. } => {
                auth.authorize(principal, &Access::Consume { stream, consumer })?
            }
            // Consuming as a group's member is consuming as the group's consumer, which the first join creates.
            Command::JoinGroup { stream, group: consumer, .. }
            | Command::Heartbeat { stream, group: consumer, .. }
            | Command::LeaveGroup { stream, group: consumer, .. }
            | Command::MemberFetch { stream, group: consumer, .. }
            | Command::MemberAck { stream, group: consumer, .. }
            | Command::MemberCommit { stream, group: consumer, .. } => {
                auth.authorize(principal, &Access::Consume { stream, consumer })?
            }
            // A transactional id belongs to the principal that registered it: another's registration would fence
            // the owner and abort its open transaction.
            Command::InitProducer { transactional_id, .. } => {
                auth.authorize(principal, &Access::AnyPublish)?;
                if let Some(&producer_id) = self.transactional_ids.get(transactional_id.as_str()) {
                    auth.authorize_producer(principal, producer_id).map_err(|_| Rejection::PermissionDenied {
                        principal: principal.to_string(),
                        needs: format!(
                            "ownership of transactional id {transactional_id:?} (another principal registered it)"
                        ),
                    })?;
                }
            }
            Command::BeginTransaction(r)
            | Command::PrepareTransaction(r)
            | Command::CommitTransaction(r)
            | Command::AbortTransaction(r) => auth.authorize_producer(principal, r.producer_id)?,
            // A principal may revoke a token of its own (one it leaked), whatever its grants; any other needs
            // cluster admin.
            Command::RevokeToken { token } if auth.holder(token).is_some_and(|holder| **holder == *principal) => {}
            Command::PutPrincipal { .. }
            | Command::DeletePrincipal { .. }
            | Command::AddToken { .. }
            | Command::RevokeToken { .. }
            | Command::RevokeCertificate { .. }
            | Command::SetQuotas { .. }
            | Command::PutCell { .. }
            | Command::PlaceStream { .. }
            | Command::MoveStream { .. }
            | Command::FinishMove { .. }
            | Command::Unplace { .. }
            | Command::FenceStream { .. }
            | Command::ReceiveStream { .. }
            | Command::AcceptStream { .. }
            | Command::Ingest { .. }
            | Command::CreateMirror { .. }
            | Command::MirrorIngest { .. }
            | Command::GrantMirror { .. } => auth.authorize(principal, &Access::ClusterAdmin)?,
            // A mirror's own calls on its source: its principal's mirror grant on the stream is enough.
            Command::RegisterMirror { stream, .. } | Command::MirrorProgress { stream, .. } => {
                auth.authorize(principal, &Access::Mirror(stream))?
            }
            Command::Tick | Command::As { .. } | Command::ReserveSubjects { .. } => {
                return Err(Rejection::PermissionDenied {
                    principal: principal.to_string(),
                    needs: "the node's own authority (this command is not a client's)".to_string(),
                });
            }
        }
        Ok(())
    }

    pub(super) fn put_principal(&mut self, name: &str, grants: Grants) -> Result<Outcome, Rejection> {
        let created = self.auth.put_principal(name, grants.clone())?;
        let principal = self.auth.authenticate(&Actor::Vouched(name.to_string()))?;
        self.effects.note(|| Transition::Granted { principal, grants });
        Ok(Outcome::PrincipalPut { created })
    }

    pub(super) fn delete_principal(&mut self, name: &str) -> Result<Outcome, Rejection> {
        let principal = self
            .auth
            .authenticate(&Actor::Vouched(name.to_string()))
            .map_err(|_| Rejection::PrincipalNotFound { principal: name.to_string() })?;
        self.auth.delete_principal(name)?;
        self.effects.note(|| Transition::PrincipalDeleted { principal });
        Ok(Outcome::PrincipalDeleted)
    }

    pub(super) fn add_token(&mut self, principal: &str, token: TokenHash) -> Result<Outcome, Rejection> {
        self.auth.add_token(principal, token)?;
        let principal = self.auth.authenticate(&Actor::Token(token))?;
        self.effects.note(|| Transition::TokenAdded { principal, token });
        Ok(Outcome::TokenAdded)
    }

    pub(super) fn grant_mirror(&mut self, principal: &str, streams: &[String]) -> Result<Outcome, Rejection> {
        self.auth.grant_mirror(principal, streams)?;
        Ok(Outcome::MirrorGranted)
    }

    /// Whether `principal` may mirror `stream` (stored name) here: read it for its mirror, and its info.
    pub fn authorize_mirror(&self, principal: &str, stream: &str) -> Result<(), Rejection> {
        self.auth.authorize(principal, &Access::Mirror(stream))
    }

    pub(super) fn revoke_token(&mut self, token: TokenHash) -> Result<Outcome, Rejection> {
        let principal = self.auth.revoke_token(token)?;
        self.effects.note(|| Transition::TokenRevoked { principal, token });
        Ok(Outcome::TokenRevoked)
    }
}

/// A refusal of a principal's write to subjects reserved for the node.
fn reserved(principal: &str, filter: &str) -> Rejection {
    Rejection::PermissionDenied {
        principal: principal.to_string(),
        needs: format!("the node's own authority ({filter} is reserved for the node's own streams)"),
    }
}
