//! Tenants: names that one tenant cannot use to reach another's streams, subjects, consumers or producers.
//!
//! A principal named `TENANT/NAME` belongs to tenant `TENANT`; every other principal belongs to the cell itself. A
//! tenant's principal names everything relative to its tenant, and the cell translates at the boundary, inside the
//! state machine (so every replica agrees):
//!
//! | what                  | the tenant says | the cell stores  |
//! | --------------------- | --------------- | ---------------- |
//! | stream                | `orders`        | `acme/orders`    |
//! | subject, filter       | `orders.eu`     | `@acme.orders.eu`|
//! | transactional id      | `tx-1`          | `acme/tx-1`      |
//! | grant `orders.>`      | `orders.>`      | `@acme.orders.>` |
//! | consume grant `*/w`   | `*/w`           | `acme/*/w`       |
//!
//! A name a tenant writes can hold neither `/` (names are letters, digits, `-` and `_`) nor reach outside its scope
//! token (wildcards never match a scope token in the first position, see [`crate::subject`]), so whatever a tenant
//! names lies inside its tenant. Outcomes and rejections go back in the tenant's terms. The cell's own principals see
//! the stored names: an operator administers every tenant's streams by their full names, but reads and writes a
//! tenant's subjects only through grants that name the scope (`@acme.>`); root's `>` does not reach them.

use std::sync::Arc;

use crate::command::Command;
use crate::config::StreamConfig;
use crate::error::Rejection;
use crate::info::{ConsumerInfo, StreamInfo};
use crate::outcome::{Outcome, PublishAck, Record};
use crate::subject::{SCOPE_SIGIL, scoped_name, scoped_subject};

pub use crate::subject::{TENANT_SEPARATOR, subject_tenant, tenant_of, validate_scoped_name};

/// Where a principal's names live: its tenant's, or the cell's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope<'a> {
    tenant: Option<&'a str>,
}

impl<'a> Scope<'a> {
    /// The scope of a principal.
    pub fn of(principal: &'a str) -> Self {
        Scope { tenant: tenant_of(principal) }
    }

    /// The cell's own scope: names are taken as stored.
    pub fn cell() -> Self {
        Scope { tenant: None }
    }

    /// Its tenant, if it is one's.
    pub fn tenant(&self) -> Option<&'a str> {
        self.tenant
    }

    /// The stored name of a stream (or transactional id) this scope names.
    pub fn name_in(&self, name: &str) -> String {
        match self.tenant {
            Some(tenant) => scoped_name(tenant, name),
            None => name.to_string(),
        }
    }

    /// How this scope names a stored stream, or `None` when the stream is not in it (another tenant's, or the cell's
    /// when this is a tenant's scope).
    pub fn name_out<'n>(&self, name: &'n str) -> Option<&'n str> {
        match self.tenant {
            Some(tenant) => name.strip_prefix(tenant)?.strip_prefix(TENANT_SEPARATOR),
            None => Some(name),
        }
    }

    /// The stored subject or filter of one this scope names.
    pub fn subject_in(&self, subject: &str) -> String {
        match self.tenant {
            Some(tenant) => scoped_subject(tenant, subject),
            None => subject.to_string(),
        }
    }

    /// How this scope names a stored subject or filter (as stored when it is not in the scope).
    pub fn subject_out<'s>(&self, subject: &'s str) -> &'s str {
        match self.tenant {
            Some(tenant) => subject
                .strip_prefix(SCOPE_SIGIL)
                .and_then(|rest| rest.strip_prefix(tenant))
                .and_then(|rest| rest.strip_prefix('.'))
                .unwrap_or(subject),
            None => subject,
        }
    }

    /// How this scope names a stored stream, as stored when it is not in the scope (in a message).
    fn stream_out(&self, name: &str) -> String {
        self.name_out(name).unwrap_or(name).to_string()
    }

    /// The command a principal of this scope sent, in stored names.
    pub fn command_in(&self, command: Command) -> Command {
        if self.tenant.is_none() {
            return command;
        }
        let stream = |name: String| self.name_in(&name);
        match command {
            Command::CreateStream { name, mut config } => {
                config.subjects = config.subjects.iter().map(|s| self.subject_in(s)).collect();
                config.dead_letter_stream = config.dead_letter_stream.map(stream);
                Command::CreateStream { name: self.name_in(&name), config }
            }
            Command::UpdateStream { name, mut config } => {
                config.subjects = config.subjects.iter().map(|s| self.subject_in(s)).collect();
                config.dead_letter_stream = config.dead_letter_stream.map(stream);
                Command::UpdateStream { name: self.name_in(&name), config }
            }
            Command::DeleteStream { name } => Command::DeleteStream { name: stream(name) },
            Command::Publish(mut request) => {
                request.subject = self.subject_in(&request.subject);
                Command::Publish(request)
            }
            Command::Recall { stream: name, partition, seq } => {
                Command::Recall { stream: stream(name), partition, seq }
            }
            Command::CreateConsumer { stream: name, name: consumer, mut config } => {
                config.filter_subject = config.filter_subject.map(|s| self.subject_in(&s));
                Command::CreateConsumer { stream: stream(name), name: consumer, config }
            }
            Command::UpdateConsumer { stream: name, name: consumer, mut config } => {
                config.filter_subject = config.filter_subject.map(|s| self.subject_in(&s));
                Command::UpdateConsumer { stream: stream(name), name: consumer, config }
            }
            Command::DeleteConsumer { stream: name, name: consumer } => {
                Command::DeleteConsumer { stream: stream(name), name: consumer }
            }
            Command::Fetch { stream: name, consumer, member, max } => {
                Command::Fetch { stream: stream(name), consumer, member, max }
            }
            Command::Ack { stream: name, consumer, partition, seq, kind } => {
                Command::Ack { stream: stream(name), consumer, partition, seq, kind }
            }
            Command::CommitCursor { stream: name, consumer, partition, next_seq } => {
                Command::CommitCursor { stream: stream(name), consumer, partition, next_seq }
            }
            Command::InitProducer { transactional_id, transaction_timeout_ms } => {
                Command::InitProducer { transactional_id: self.name_in(&transactional_id), transaction_timeout_ms }
            }
            Command::RegisterPeer { stream: name, peer } => Command::RegisterPeer { stream: stream(name), peer },
            Command::PeerProgress { stream: name, peer, partition, received_seq } => {
                Command::PeerProgress { stream: stream(name), peer, partition, received_seq }
            }
            Command::UnregisterPeer { stream: name, peer } => Command::UnregisterPeer { stream: stream(name), peer },
            Command::JoinGroup { stream: name, group, member, strategy, session_timeout_ms, mut config } => {
                config.filter_subject = config.filter_subject.map(|s| self.subject_in(&s));
                Command::JoinGroup { stream: stream(name), group, member, strategy, session_timeout_ms, config }
            }
            Command::Heartbeat { stream: name, group, member, generation, released } => {
                Command::Heartbeat { stream: stream(name), group, member, generation, released }
            }
            Command::LeaveGroup { stream: name, group, member } => {
                Command::LeaveGroup { stream: stream(name), group, member }
            }
            Command::MemberFetch { stream: name, group, member, generation, max } => {
                Command::MemberFetch { stream: stream(name), group, member, generation, max }
            }
            Command::MemberAck { stream: name, group, member, generation, partition, seq, kind } => {
                Command::MemberAck { stream: stream(name), group, member, generation, partition, seq, kind }
            }
            Command::MemberCommit { stream: name, group, member, generation, partition, next_seq } => {
                Command::MemberCommit { stream: stream(name), group, member, generation, partition, next_seq }
            }
            Command::Acks { stream: name, consumer, member, items } => {
                Command::Acks { stream: stream(name), consumer, member, items }
            }
            // Producer references carry ids the cell gave out; the rest is the cell's own (refused to a tenant's
            // principal by its grants, which never hold cluster admin).
            other @ (Command::BeginTransaction(_)
            | Command::PrepareTransaction(_)
            | Command::CommitTransaction(_)
            | Command::AbortTransaction(_)
            | Command::Tick
            | Command::As { .. }
            | Command::PutPrincipal { .. }
            | Command::DeletePrincipal { .. }
            | Command::AddToken { .. }
            | Command::RevokeToken { .. }
            | Command::RevokeCertificate { .. }
            | Command::SetQuotas { .. }
            | Command::ReserveSubjects { .. }
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
            | Command::RegisterMirror { .. }
            | Command::MirrorProgress { .. }
            | Command::GrantMirror { .. }) => other,
        }
    }

    /// A stream's info as this scope sees it.
    pub fn stream_info_out(&self, mut info: StreamInfo) -> StreamInfo {
        if self.tenant.is_some() {
            info.name = Arc::from(self.stream_out(&info.name));
            self.config_out(&mut info.config);
        }
        info
    }

    /// A stream's config as this scope sees it.
    pub fn config_out(&self, config: &mut StreamConfig) {
        if self.tenant.is_some() {
            config.subjects = config.subjects.iter().map(|s| self.subject_out(s).to_string()).collect();
            config.dead_letter_stream = config.dead_letter_stream.as_deref().map(|name| self.stream_out(name));
        }
    }

    /// A consumer's info as this scope sees it.
    pub fn consumer_info_out(&self, mut info: ConsumerInfo) -> ConsumerInfo {
        if self.tenant.is_some() {
            info.config.filter_subject = info.config.filter_subject.map(|s| self.subject_out(&s).to_string());
        }
        info
    }

    /// A stored record as this scope sees it.
    pub fn record_out(&self, mut record: Record) -> Record {
        if self.tenant.is_some() {
            let subject = self.subject_out(&record.subject);
            if subject.len() != record.subject.len() {
                record.subject = Arc::from(subject);
            }
        }
        record
    }

    fn ack_out(&self, ack: PublishAck) -> PublishAck {
        PublishAck {
            stream: Arc::from(self.stream_out(&ack.stream)),
            original: ack.original.map(|record| Box::new(self.record_out(*record))),
            ..ack
        }
    }

    /// An outcome in this scope's terms.
    pub fn outcome_out(&self, outcome: Outcome) -> Outcome {
        if self.tenant.is_none() {
            return outcome;
        }
        match outcome {
            Outcome::Published(ack) => Outcome::Published(self.ack_out(ack)),
            Outcome::Fetched(deliveries) => Outcome::Fetched(
                deliveries
                    .into_iter()
                    .map(|mut delivery| {
                        delivery.record = self.record_out(delivery.record);
                        delivery
                    })
                    .collect(),
            ),
            Outcome::TransactionCommitted { messages, next } => Outcome::TransactionCommitted {
                messages: messages.into_iter().map(|ack| self.ack_out(ack)).collect(),
                next,
            },
            Outcome::AckedEach(answers) => Outcome::AckedEach(
                answers.into_iter().map(|answer| answer.map_err(|rejection| self.rejection_out(rejection))).collect(),
            ),
            other => other,
        }
    }

    /// A message naming stored names, in this scope's terms: its names appear quoted (`"acme/orders"`,
    /// `"@acme.orders.>"`) or after a space (`consume acme/orders/billing`).
    fn text_out(&self, text: &str) -> String {
        match self.tenant {
            Some(tenant) => text
                .replace(&format!("\"{tenant}{TENANT_SEPARATOR}"), "\"")
                .replace(&format!("\"{SCOPE_SIGIL}{tenant}."), "\"")
                .replace(&format!(" {tenant}{TENANT_SEPARATOR}"), " "),
            None => text.to_string(),
        }
    }

    /// A rejection in this scope's terms: the names it carries as the principal wrote them.
    pub fn rejection_out(&self, rejection: Rejection) -> Rejection {
        if self.tenant.is_none() {
            return rejection;
        }
        let stream = |name: String| self.stream_out(&name);
        let subject = |name: String| self.subject_out(&name).to_string();
        match rejection {
            Rejection::StreamNotFound { stream: s } => Rejection::StreamNotFound { stream: stream(s) },
            Rejection::ConsumerNotFound { stream: s, consumer } => {
                Rejection::ConsumerNotFound { stream: stream(s), consumer }
            }
            Rejection::NoStreamForSubject { subject: s } => Rejection::NoStreamForSubject { subject: subject(s) },
            Rejection::MessageNotFound { stream: s, partition, seq } => {
                Rejection::MessageNotFound { stream: stream(s), partition, seq }
            }
            Rejection::PeerNotFound { stream: s, peer } => Rejection::PeerNotFound { stream: stream(s), peer },
            Rejection::InvalidSubject { subject: s, reason } => {
                Rejection::InvalidSubject { subject: subject(s), reason }
            }
            Rejection::Conflict { what, name } => Rejection::Conflict { what, name: stream(name) },
            Rejection::SubjectOverlap { subject: s, other, owner } => {
                Rejection::SubjectOverlap { subject: subject(s), other: subject(other), owner: self.text_out(&owner) }
            }
            Rejection::InUse { stream: s, by } => Rejection::InUse { stream: stream(s), by: self.text_out(&by) },
            Rejection::PermissionDenied { principal, needs } => {
                Rejection::PermissionDenied { principal, needs: self.text_out(&needs) }
            }
            Rejection::InvalidConfig { reason } => Rejection::InvalidConfig { reason: self.text_out(&reason) },
            Rejection::Invalid { reason } => Rejection::Invalid { reason: self.text_out(&reason) },
            Rejection::Pinned { stream: s, partition, seq } => Rejection::Pinned { stream: stream(s), partition, seq },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_in_and_come_back_out() {
        let acme = Scope::of("acme/alice");
        assert_eq!(acme.tenant(), Some("acme"));
        assert_eq!(acme.name_in("orders"), "acme/orders");
        assert_eq!(acme.name_out("acme/orders"), Some("orders"));
        assert_eq!(acme.name_out("acmeX/orders"), None);
        assert_eq!(acme.name_out("orders"), None);
        assert_eq!(acme.subject_in("orders.>"), "@acme.orders.>");
        assert_eq!(acme.subject_out("@acme.orders.eu"), "orders.eu");
        assert_eq!(acme.subject_out("@acmeX.orders"), "@acmeX.orders");
        let cell = Scope::of("alice");
        assert_eq!(cell, Scope::cell());
        assert_eq!(cell.name_in("orders"), "orders");
        assert_eq!(cell.name_out("acme/orders"), Some("acme/orders"));
        assert_eq!(subject_tenant("@acme.orders"), Some("acme"));
        assert_eq!(subject_tenant("orders"), None);
    }

    #[test]
    fn scoped_names_have_two_valid_parts() {
        assert!(validate_scoped_name("acme/alice").is_ok());
        assert!(validate_scoped_name("alice").is_ok());
        assert!(validate_scoped_name("acme/").is_err());
        assert!(validate_scoped_name("/alice").is_err());
        assert!(validate_scoped_name("a/b/c").is_err());
        assert!(validate_scoped_name("a b/c").is_err());
    }
}
