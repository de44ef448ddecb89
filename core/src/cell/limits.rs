//! What a command may ask for at all: the cell's size limits and the checks that need no state.

use crate::auth::Actor;
use crate::command::{AckKind, Command, GroupMember, IngestMessage, PublishRequest};
use crate::config::{MAX_DURATION_MS, MAX_PAYLOAD_LIMIT};
use crate::error::{Cap, NameKind, Rejection};
use crate::mirror::MAX_RECALLS_READ;
use crate::placement::{MAX_ADDRESS_BYTES, MAX_CELL_ADDRESSES};
use crate::subject::{TENANT_SEPARATOR, tenant_of, validate_name, validate_subject};
use crate::tenant::validate_scoped_name;

/// Most streams in a cell.
pub const MAX_STREAMS: usize = 10_000;
/// Most consumers on one stream.
pub const MAX_CONSUMERS_PER_STREAM: usize = 1024;
/// Most registered peers on one stream.
pub const MAX_PEERS_PER_STREAM: usize = 64;
/// Most bytes of one message's key.
pub const MAX_KEY_BYTES: usize = 1024;
/// Most transactional producers a cell holds.
pub const MAX_PRODUCERS: usize = 10_000;
/// How long a transactional producer with no open transaction may do nothing before the cell forgets it (seven
/// days): its id and epochs are then fenced for good, and an instance registering its transactional id again starts a
/// new producer. Idle producers so free their place under [`MAX_PRODUCERS`] without an operator.
pub const PRODUCER_IDLE_MS: u64 = 7 * 24 * 3600 * 1000;
/// Most transactions open (or prepared) at once in a cell.
pub const MAX_OPEN_TRANSACTIONS: usize = 1024;
/// Most message ids within their dedup window in one stream: a publish with a new id beyond it is refused until the
/// window lets older ids go (a committed transaction may take it over by at most its own messages). After its window
/// an id is remembered only while its message is retained, which the stream's own limits bound.
pub const MAX_DEDUP_IDS: usize = 1_000_000;
/// Most messages one fetch may ask for.
pub const MAX_FETCH: u32 = 10_000;
pub use crate::outcome::MAX_RESPONSE_BYTES;
/// Longest message id or transactional id, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Most header bytes (names plus values) on one message.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most bytes one command may take encoded: the largest payload any stream accepts, and a mebibyte for everything
/// else (subject, key, headers, ids, configs). A host bounds its log entries by commands' encoded sizes.
pub const MAX_COMMAND_BYTES: usize = MAX_PAYLOAD_LIMIT as usize + 1024 * 1024;
/// Most records one read returns.
pub const MAX_READ: usize = 10_000;
/// Most messages one ingest copies (a move's catch-up sends its batches well below it, by bytes).
pub const MAX_INGEST_MESSAGES: usize = 10_000;
/// Most sequences an ingest may pass over within a partition holding messages (the holes left where the cell a
/// stream moves from removed messages): the cell holds a slot per hole.
pub const MAX_INGEST_GAP: u64 = 1 << 24;
/// Most members of one consumer group.
pub const MAX_GROUP_MEMBERS: usize = 1024;
/// Shortest session timeout of a group member.
pub const MIN_SESSION_TIMEOUT_MS: u64 = 100;
/// Longest session timeout of a group member (30 minutes).
pub const MAX_SESSION_TIMEOUT_MS: u64 = 30 * 60 * 1000;

pub(super) fn invalid(reason: impl Into<String>) -> Rejection {
    Rejection::Invalid { reason: reason.into() }
}

pub(super) fn check_name(kind: NameKind, name: &str) -> Result<(), Rejection> {
    validate_name(name).map_err(|reason| Rejection::InvalidName { kind, name: name.to_string(), reason })
}

/// A principal's name: `NAME`, or `TENANT/NAME` for a tenant's (see [`crate::tenant`]).
pub(super) fn check_principal(name: &str) -> Result<(), Rejection> {
    validate_scoped_name(name).map_err(|reason| Rejection::InvalidName {
        kind: NameKind::Principal,
        name: name.to_string(),
        reason,
    })
}

fn check_serial(serial: &[u8]) -> Result<(), Rejection> {
    if serial.is_empty() || serial.len() > crate::auth::MAX_SERIAL_BYTES {
        return Err(invalid(format!(
            "a certificate serial is 1 to {} bytes; this one is {}",
            crate::auth::MAX_SERIAL_BYTES,
            serial.len()
        )));
    }
    Ok(())
}

pub(super) fn check_id(kind: NameKind, id: &str) -> Result<(), Rejection> {
    let reason = if id.is_empty() {
        Some("is empty".to_string())
    } else if id.len() > MAX_ID_BYTES {
        Some(format!("is {} bytes long; the limit is {MAX_ID_BYTES}", id.len()))
    } else {
        id.chars().find(|c| c.is_control()).map(|c| format!("contains the control character {c:?}"))
    };
    match reason {
        Some(reason) => Err(Rejection::InvalidName { kind, name: id.to_string(), reason }),
        None => Ok(()),
    }
}

pub(super) fn check_duration(what: &str, value: u64) -> Result<(), Rejection> {
    if value > MAX_DURATION_MS {
        return Err(invalid(format!("{what} of {value} ms exceeds the limit of {MAX_DURATION_MS} ms")));
    }
    Ok(())
}

/// A stream name in a placement: a stored name, so a tenant's (`TENANT/NAME`) too.
fn check_placed_stream(name: &str) -> Result<(), Rejection> {
    validate_scoped_name(name).map_err(|reason| Rejection::InvalidName {
        kind: NameKind::Stream,
        name: name.to_string(),
        reason,
    })
}

/// A move's epoch: 0 is the epoch of a stream never placed, so no move is at it.
fn check_move_epoch(epoch: u64) -> Result<(), Rejection> {
    if epoch == 0 {
        return Err(invalid("a move's ownership epoch is at least 1 (epoch 0 is a stream no directory placed)"));
    }
    Ok(())
}

/// A cell's node addresses: at least one, at most [`MAX_CELL_ADDRESSES`], each a short `HOST:PORT` or URL without
/// whitespace, and no address twice.
fn check_addresses(addresses: &[String]) -> Result<(), Rejection> {
    if addresses.is_empty() || addresses.len() > MAX_CELL_ADDRESSES {
        return Err(invalid(format!(
            "a cell has between 1 and {MAX_CELL_ADDRESSES} addresses; {} were given",
            addresses.len()
        )));
    }
    for (i, address) in addresses.iter().enumerate() {
        if address.is_empty() || address.len() > MAX_ADDRESS_BYTES {
            return Err(invalid(format!(
                "address {address:?} is {} bytes long; an address is 1 to {MAX_ADDRESS_BYTES} bytes",
                address.len()
            )));
        }
        if address.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid(format!("address {address:?} holds whitespace or a control character")));
        }
        if addresses[..i].contains(address) {
            return Err(invalid(format!("address {address:?} is given twice")));
        }
    }
    Ok(())
}

/// A move's positions: one per partition, at most as many as a stream has partitions.
fn check_through(through: &[u64]) -> Result<(), Rejection> {
    if through.len() > crate::config::MAX_PARTITIONS as usize {
        return Err(invalid(format!(
            "positions are given per partition, at most {}; {} were given",
            crate::config::MAX_PARTITIONS,
            through.len()
        )));
    }
    Ok(())
}

/// A message copied into a stream moving here: a publish's checks, a position, and none of what only a publish asks
/// for (a condition, a TTL, a delay, a transaction).
fn check_ingested(message: &IngestMessage) -> Result<(), Rejection> {
    let request = &message.request;
    check_request(request)?;
    if request.payload.len() > MAX_PAYLOAD_LIMIT as usize {
        let (size, max) = (request.payload.len() as u64, u64::from(MAX_PAYLOAD_LIMIT));
        return Err(Rejection::PayloadTooLarge { size, max });
    }
    if message.seq == 0 {
        return Err(invalid("a copied message's sequence is at least 1"));
    }
    if request.expected_last_seq.is_some()
        || request.expected_last_subject_seq.is_some()
        || request.ttl_ms.is_some()
        || request.deliver_after_ms.is_some()
        || request.transaction.is_some()
    {
        return Err(invalid("a copied message carries no condition, TTL, delay or transaction"));
    }
    Ok(())
}

/// Checks everything about a publish that needs no state.
pub(super) fn check_request(request: &PublishRequest) -> Result<(), Rejection> {
    validate_subject(&request.subject)
        .map_err(|reason| Rejection::InvalidSubject { subject: request.subject.clone(), reason })?;
    if let Some(msg_id) = &request.msg_id {
        check_id(NameKind::MessageId, msg_id)?;
    }
    if let Some(key) = &request.key
        && key.len() > MAX_KEY_BYTES
    {
        return Err(Rejection::CapReached { cap: Cap::KeyBytes, limit: MAX_KEY_BYTES as u64 });
    }
    let mut header_bytes = 0usize;
    for (name, value) in &request.headers {
        if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace() || c == ':') {
            return Err(Rejection::InvalidName {
                kind: NameKind::Header,
                name: name.clone(),
                reason: "must be non-empty, without whitespace, control characters or ':'".to_string(),
            });
        }
        header_bytes += name.len() + value.len();
    }
    if header_bytes > MAX_HEADER_BYTES {
        return Err(invalid(format!("headers take {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}")));
    }
    if request.ttl_ms == Some(0) {
        return Err(invalid("ttl_ms must be at least 1 when set"));
    }
    check_duration("ttl_ms", request.ttl_ms.unwrap_or(0))?;
    check_duration("deliver_after_ms", request.deliver_after_ms.unwrap_or(0))?;
    Ok(())
}

/// Who a command comes from, for [`Command::check`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Author {
    /// The node itself: a command not inside [`Command::As`].
    Node,
    /// A principal, through [`Command::As`].
    Principal,
}

impl Command {
    /// The checks that need no state and that [`crate::Cell::apply`] makes before anything else for this command, with
    /// the same rejection: a host runs them before proposing, so a command they refuse never reaches the log (it would
    /// be refused on every replica after costing an fsync on each).
    pub fn check(&self) -> Result<(), Rejection> {
        self.check_from(Author::Node)
    }

    /// The checks, for a command from `author`. The node's own commands (never inside [`Command::As`]) may create a
    /// tenant's stream by its full name (`TENANT/NAME`: the mailroom makes a tenant's inbox); a principal's may not,
    /// since a tenant's names must hold no `/` before its scope is put in front of them.
    fn check_from(&self, author: Author) -> Result<(), Rejection> {
        match self {
            Command::Publish(request) => {
                check_request(request)?;
                // Over what any stream accepts: refused here with that limit (a stream's own, smaller one is
                // checked when the publish is routed).
                if request.payload.len() > MAX_PAYLOAD_LIMIT as usize {
                    let (size, max) = (request.payload.len() as u64, u64::from(MAX_PAYLOAD_LIMIT));
                    return Err(Rejection::PayloadTooLarge { size, max });
                }
                Ok(())
            }
            Command::CreateStream { name, .. } if author == Author::Node && tenant_of(name).is_some() => {
                validate_scoped_name(name).map_err(|reason| Rejection::InvalidName {
                    kind: NameKind::Stream,
                    name: name.to_string(),
                    reason,
                })
            }
            Command::CreateStream { name, .. } => check_name(NameKind::Stream, name),
            Command::CreateConsumer { name, config, .. } => {
                check_name(NameKind::Consumer, name)?;
                config.validate()
            }
            Command::UpdateConsumer { config, .. } => config.validate(),
            Command::Fetch { member, max, .. } => {
                check_name(NameKind::Member, member)?;
                if *max == 0 || *max > MAX_FETCH {
                    return Err(invalid(format!("fetch max must be between 1 and {MAX_FETCH}")));
                }
                Ok(())
            }
            Command::Ack { kind: AckKind::Nack { delay_ms }, .. } => check_duration("nack delay_ms", *delay_ms),
            Command::Acks { consumer, member, items, .. } => {
                if items.is_empty() || items.len() > MAX_FETCH as usize {
                    return Err(invalid(format!("a command carries between 1 and {MAX_FETCH} acks")));
                }
                if let Some(GroupMember { member, .. }) = member {
                    check_name(NameKind::Consumer, consumer)?;
                    check_name(NameKind::Member, member)?;
                }
                items.iter().try_for_each(|item| match item.kind {
                    AckKind::Nack { delay_ms } => check_duration("nack delay_ms", delay_ms),
                    _ => Ok(()),
                })
            }
            Command::JoinGroup { group, member, session_timeout_ms, config, .. } => {
                check_name(NameKind::Consumer, group)?;
                check_name(NameKind::Member, member)?;
                if !(MIN_SESSION_TIMEOUT_MS..=MAX_SESSION_TIMEOUT_MS).contains(session_timeout_ms) {
                    return Err(invalid(format!(
                        "session_timeout_ms must be between {MIN_SESSION_TIMEOUT_MS} and {MAX_SESSION_TIMEOUT_MS}"
                    )));
                }
                config.validate()
            }
            Command::Heartbeat { group, member, released, .. } => {
                check_name(NameKind::Consumer, group)?;
                check_name(NameKind::Member, member)?;
                if released.len() > crate::config::MAX_PARTITIONS as usize {
                    return Err(invalid(format!(
                        "a heartbeat releases at most {} partitions",
                        crate::config::MAX_PARTITIONS
                    )));
                }
                Ok(())
            }
            Command::LeaveGroup { group, member, .. } | Command::MemberCommit { group, member, .. } => {
                check_name(NameKind::Consumer, group)?;
                check_name(NameKind::Member, member)
            }
            Command::MemberFetch { group, member, max, .. } => {
                check_name(NameKind::Consumer, group)?;
                check_name(NameKind::Member, member)?;
                if *max == 0 || *max > MAX_FETCH {
                    return Err(invalid(format!("fetch max must be between 1 and {MAX_FETCH}")));
                }
                Ok(())
            }
            Command::MemberAck { group, member, kind, .. } => {
                check_name(NameKind::Consumer, group)?;
                check_name(NameKind::Member, member)?;
                match kind {
                    AckKind::Nack { delay_ms } => check_duration("nack delay_ms", *delay_ms),
                    _ => Ok(()),
                }
            }
            Command::InitProducer { transactional_id, transaction_timeout_ms } => {
                check_id(NameKind::TransactionalId, transactional_id)?;
                // A tenant's ids are stored as `TENANT/ID`: a principal's id holding the separator could name (and
                // squat on) another tenant's.
                if author == Author::Principal && transactional_id.contains(TENANT_SEPARATOR) {
                    return Err(Rejection::InvalidName {
                        kind: NameKind::TransactionalId,
                        name: transactional_id.clone(),
                        reason: format!("contains {TENANT_SEPARATOR:?}, which separates a tenant from its names"),
                    });
                }
                if *transaction_timeout_ms == 0 || *transaction_timeout_ms > MAX_DURATION_MS {
                    return Err(invalid(format!("transaction_timeout_ms must be between 1 and {MAX_DURATION_MS}")));
                }
                Ok(())
            }
            Command::RegisterPeer { peer, .. } => check_name(NameKind::Peer, peer),
            Command::As { actor, command } => {
                match actor {
                    Actor::Token(_) => {}
                    Actor::Vouched(name) => check_principal(name)?,
                    Actor::Certified { principal, serial } => {
                        check_principal(principal)?;
                        check_serial(serial)?;
                    }
                }
                if matches!(**command, Command::As { .. }) {
                    return Err(invalid("a command runs as one principal; As inside As is refused"));
                }
                command.check_from(Author::Principal)
            }
            Command::PutPrincipal { name, grants } => {
                check_principal(name)?;
                grants.validate()
            }
            Command::DeletePrincipal { name } | Command::AddToken { principal: name, .. } => check_principal(name),
            Command::RevokeCertificate { serial, subject, .. } => {
                check_serial(serial)?;
                if subject.len() > MAX_ID_BYTES || subject.chars().any(char::is_control) {
                    return Err(invalid(format!(
                        "a revoked certificate's subject is at most {MAX_ID_BYTES} bytes without control characters"
                    )));
                }
                Ok(())
            }
            Command::SetQuotas { tenant: Some(tenant), .. } => check_name(NameKind::Tenant, tenant),
            Command::ReserveSubjects { filter } => crate::subject::validate_filter(filter)
                .map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason }),
            Command::PutCell { cell, addresses } => {
                check_name(NameKind::Cell, cell)?;
                check_addresses(addresses)
            }
            Command::PlaceStream { stream, cell } | Command::MoveStream { stream, to: cell, .. } => {
                check_placed_stream(stream)?;
                check_name(NameKind::Cell, cell)
            }
            Command::FenceStream { stream, to: cell, epoch }
            | Command::ReceiveStream { stream, from: cell, epoch, .. } => {
                check_placed_stream(stream)?;
                check_name(NameKind::Cell, cell)?;
                check_move_epoch(*epoch)
            }
            Command::AcceptStream { stream, epoch, through } => {
                check_placed_stream(stream)?;
                check_move_epoch(*epoch)?;
                check_through(through)
            }
            Command::FinishMove { stream, epoch } => {
                check_placed_stream(stream)?;
                check_move_epoch(*epoch)
            }
            Command::Ingest { stream, epoch, messages, through } => {
                check_placed_stream(stream)?;
                check_move_epoch(*epoch)?;
                check_through(through)?;
                if messages.len() > MAX_INGEST_MESSAGES {
                    return Err(invalid(format!(
                        "an ingest copies at most {MAX_INGEST_MESSAGES} messages; {} were given",
                        messages.len()
                    )));
                }
                for message in messages {
                    check_ingested(message)?;
                }
                Ok(())
            }
            Command::Unplace { stream } => check_placed_stream(stream),
            Command::CreateMirror { name, source, .. } => {
                check_placed_stream(name)?;
                check_name(NameKind::Cell, &source.cell)?;
                check_placed_stream(&source.stream)?;
                check_addresses(&source.addresses)
            }
            Command::MirrorIngest { stream, messages, through, recalls, .. } => {
                check_placed_stream(stream)?;
                check_through(through)?;
                if messages.len() > MAX_INGEST_MESSAGES || recalls.len() > MAX_RECALLS_READ {
                    return Err(invalid(format!(
                        "a mirror's copy carries at most {MAX_INGEST_MESSAGES} messages and {MAX_RECALLS_READ} \
                         recalls; {} and {} were given",
                        messages.len(),
                        recalls.len()
                    )));
                }
                messages.iter().try_for_each(check_ingested)
            }
            Command::RegisterMirror { stream, peer } => {
                check_placed_stream(stream)?;
                check_name(NameKind::Peer, peer)
            }
            Command::MirrorProgress { stream, peer, received, .. } => {
                check_placed_stream(stream)?;
                check_name(NameKind::Peer, peer)?;
                check_through(received)
            }
            _ => Ok(()),
        }
    }
}

impl Command {
    /// How many bytes the command takes in a log entry (its postcard encoding), counted without encoding it.
    pub fn encoded_size(&self) -> usize {
        postcard::serialize_with_flavor(self, postcard::ser_flavors::Size::default())
            .expect("counting the encoding of a command does not fail: every type is plainly serializable")
    }

    /// Its encoded size, refused over [`MAX_COMMAND_BYTES`]: a host checks it (with [`Command::check`]) before
    /// proposing, and bounds its log entries by these sizes. The cell itself never sees a command over it.
    pub fn check_size(&self) -> Result<usize, Rejection> {
        let size = self.encoded_size();
        if size > MAX_COMMAND_BYTES {
            return Err(invalid(format!("the command takes {size} bytes encoded; the limit is {MAX_COMMAND_BYTES}")));
        }
        Ok(size)
    }
}
