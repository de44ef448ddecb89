//! Between the wire types of `cellog.v1` and the core's types. Wire input is checked here: an enum value out of
//! range or a missing required field becomes `INVALID_ARGUMENT`, never a panic; everything else is validated by the
//! core, which answers a typed rejection.

use std::sync::Arc;

use cellog_core::placement::{Ownership, Placement};
use cellog_core::{
    AckKind, AckState, Body, ConsumerConfig, ConsumerInfo, DeliverPolicy, Delivery, DiscardPolicy, Grants, GroupInfo,
    IngestMessage, MemberAssignment, Millis, ProducerRef, PublishAck, PublishRequest, RateLimit, Record,
    RetentionPolicy, Strategy, StreamConfig, StreamInfo, TokenHash,
};
use cellog_proto::v1;
use tonic::Status;

use crate::status::invalid_argument;

/// Default transaction timeout when a producer does not name one.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;
/// Default session timeout of a group member that names none.
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 10_000;

fn enum_value<T: TryFrom<i32>>(field: &str, value: i32) -> Result<T, Status> {
    T::try_from(value).map_err(|_| invalid_argument(format!("{field}: unknown enum value {value}")))
}

/// A stream config from the wire; unset fields take the core's defaults.
pub fn stream_config(config: Option<v1::StreamConfig>) -> Result<StreamConfig, Status> {
    let config = config.ok_or_else(|| invalid_argument("config is required"))?;
    let defaults = StreamConfig::default();
    let retention = match enum_value::<v1::RetentionPolicy>("retention", config.retention)? {
        v1::RetentionPolicy::RetentionLimits => RetentionPolicy::Limits,
        v1::RetentionPolicy::RetentionInterest => RetentionPolicy::Interest,
        v1::RetentionPolicy::RetentionWorkQueue => RetentionPolicy::WorkQueue,
    };
    let discard = match enum_value::<v1::DiscardPolicy>("discard", config.discard)? {
        v1::DiscardPolicy::DiscardOld => DiscardPolicy::Old,
        v1::DiscardPolicy::DiscardNew => DiscardPolicy::New,
    };
    Ok(StreamConfig {
        subjects: config.subjects,
        partitions: config.partitions.max(1),
        retention,
        discard,
        max_age_ms: config.max_age_ms,
        max_messages: config.max_messages,
        max_bytes: config.max_bytes,
        max_messages_per_subject: config.max_messages_per_subject,
        max_bytes_per_subject: config.max_bytes_per_subject,
        max_payload_bytes: config.max_payload_bytes.unwrap_or(defaults.max_payload_bytes),
        duplicate_window_ms: config.duplicate_window_ms.unwrap_or(defaults.duplicate_window_ms),
        rate_limit: config
            .rate_limit
            .map(|rate| RateLimit { messages_per_second: rate.messages_per_second, burst: rate.burst }),
        dead_letter_stream: config.dead_letter_stream,
    })
}

/// A stream config for the wire.
pub fn stream_config_to_wire(config: &StreamConfig) -> v1::StreamConfig {
    v1::StreamConfig {
        subjects: config.subjects.clone(),
        partitions: config.partitions,
        retention: match config.retention {
            RetentionPolicy::Limits => v1::RetentionPolicy::RetentionLimits,
            RetentionPolicy::Interest => v1::RetentionPolicy::RetentionInterest,
            RetentionPolicy::WorkQueue => v1::RetentionPolicy::RetentionWorkQueue,
        } as i32,
        discard: match config.discard {
            DiscardPolicy::Old => v1::DiscardPolicy::DiscardOld,
            DiscardPolicy::New => v1::DiscardPolicy::DiscardNew,
        } as i32,
        max_age_ms: config.max_age_ms,
        max_messages: config.max_messages,
        max_bytes: config.max_bytes,
        max_messages_per_subject: config.max_messages_per_subject,
        max_bytes_per_subject: config.max_bytes_per_subject,
        max_payload_bytes: Some(config.max_payload_bytes),
        duplicate_window_ms: Some(config.duplicate_window_ms),
        rate_limit: config
            .rate_limit
            .map(|rate| v1::RateLimit { messages_per_second: rate.messages_per_second, burst: rate.burst }),
        dead_letter_stream: config.dead_letter_stream.clone(),
    }
}

/// Stream info for the wire.
pub fn stream_info_to_wire(info: StreamInfo) -> v1::StreamInfo {
    v1::StreamInfo {
        name: info.name.to_string(),
        config: Some(stream_config_to_wire(&info.config)),
        created_at_ms: info.created_at.0,
        messages: info.n_messages,
        bytes: info.n_bytes,
        subjects: info.n_subjects,
        dedup_ids: info.n_dedup_ids,
        partitions: info
            .partitions
            .into_iter()
            .map(|p| v1::PartitionInfo {
                partition: p.partition,
                low_watermark: p.low_watermark,
                high_watermark: p.high_watermark,
                messages: p.n_messages,
                bytes: p.n_bytes,
            })
            .collect(),
        consumers: info.consumers.iter().map(|name| name.to_string()).collect(),
        peers: info.peers.into_iter().map(|p| v1::PeerInfo { name: p.name, received: p.received }).collect(),
    }
}

/// A producer reference from the wire.
pub fn producer(producer: v1::ProducerRef) -> ProducerRef {
    ProducerRef { producer_id: producer.producer_id, epoch: producer.epoch }
}

/// A producer reference for the wire.
pub fn producer_to_wire(producer: ProducerRef) -> v1::ProducerRef {
    v1::ProducerRef { producer_id: producer.producer_id, epoch: producer.epoch }
}

/// A publish from the wire.
pub fn publish(request: v1::PublishRequest) -> PublishRequest {
    PublishRequest {
        subject: request.subject,
        payload: request.payload,
        key: request.key,
        msg_id: request.msg_id,
        headers: request.headers,
        expected_last_seq: request.expected_last_seq,
        expected_last_subject_seq: request.expected_last_subject_seq,
        ttl_ms: request.ttl_ms,
        deliver_after_ms: request.deliver_after_ms,
        transaction: request.transaction.map(producer),
    }
}

/// A publish ack for the wire.
pub fn publish_ack_to_wire(ack: &PublishAck) -> v1::PublishAck {
    v1::PublishAck {
        stream: ack.stream.to_string(),
        partition: ack.partition,
        seq: ack.seq,
        duplicate: ack.duplicate,
        staged_index: None,
    }
}

/// A stored message for the wire, with its payload as this node read it (empty for a tombstone).
pub fn record_to_wire(record: Record, payload: bytes::Bytes) -> v1::Message {
    let recalled_at_ms = match record.body {
        Body::Stored(_) => None,
        Body::Tombstone { recalled_at } => Some(recalled_at.0),
    };
    v1::Message {
        partition: record.partition,
        seq: record.seq,
        subject: record.subject.to_string(),
        key: record.key,
        msg_id: record.msg_id.as_deref().map(str::to_string),
        headers: record.headers,
        payload,
        recalled_at_ms,
        stored_at_ms: record.stored_at.0,
    }
}

/// A delivery for the wire (see [`record_to_wire`]).
pub fn delivery_to_wire(delivery: Delivery, payload: bytes::Bytes) -> v1::Delivery {
    v1::Delivery {
        message: Some(record_to_wire(delivery.record, payload)),
        delivery_count: delivery.delivery_count,
        ack_deadline_ms: delivery.ack_deadline.0,
    }
}

/// A consumer config from the wire; unset fields take the core's defaults.
pub fn consumer_config(config: Option<v1::ConsumerConfig>) -> Result<ConsumerConfig, Status> {
    let config = config.unwrap_or_default();
    let defaults = ConsumerConfig::default();
    let deliver_policy = match enum_value::<v1::DeliverPolicy>("deliver_policy", config.deliver_policy)? {
        v1::DeliverPolicy::DeliverAll => DeliverPolicy::All,
        v1::DeliverPolicy::DeliverNew => DeliverPolicy::New,
        v1::DeliverPolicy::DeliverFromSequence => DeliverPolicy::FromSequence(config.deliver_from),
        v1::DeliverPolicy::DeliverFromTime => DeliverPolicy::FromTime(Millis(config.deliver_from)),
    };
    Ok(ConsumerConfig {
        filter_subject: config.filter_subject,
        deliver_policy,
        ack_wait_ms: config.ack_wait_ms.unwrap_or(defaults.ack_wait_ms),
        max_deliver: config.max_deliver,
        max_in_flight: config.max_in_flight.unwrap_or(defaults.max_in_flight),
    })
}

/// A consumer config for the wire.
pub fn consumer_config_to_wire(config: &ConsumerConfig) -> v1::ConsumerConfig {
    let (deliver_policy, deliver_from) = match config.deliver_policy {
        DeliverPolicy::All => (v1::DeliverPolicy::DeliverAll, 0),
        DeliverPolicy::New => (v1::DeliverPolicy::DeliverNew, 0),
        DeliverPolicy::FromSequence(seq) => (v1::DeliverPolicy::DeliverFromSequence, seq),
        DeliverPolicy::FromTime(at) => (v1::DeliverPolicy::DeliverFromTime, at.0),
    };
    v1::ConsumerConfig {
        filter_subject: config.filter_subject.clone(),
        deliver_policy: deliver_policy as i32,
        deliver_from,
        ack_wait_ms: Some(config.ack_wait_ms),
        max_deliver: config.max_deliver,
        max_in_flight: Some(config.max_in_flight),
    }
}

/// Consumer info for the wire.
pub fn consumer_info_to_wire(stream: &str, info: ConsumerInfo) -> v1::ConsumerInfo {
    v1::ConsumerInfo {
        stream: stream.to_string(),
        name: info.name.to_string(),
        config: Some(consumer_config_to_wire(&info.config)),
        created_at_ms: info.created_at.0,
        partitions: info
            .partitions
            .into_iter()
            .map(|p| v1::PartitionLag {
                partition: p.partition,
                cursor: p.cursor,
                ack_floor: p.ack_floor,
                lag: p.lag,
                outstanding: p.n_outstanding,
            })
            .collect(),
        lag_total: info.lag_total,
        lag_max: info.lag_max,
        pending: info.n_pending,
        ready: info.n_ready,
        oldest_unacked_age_ms: info.oldest_unacked_age_ms,
        delivered: info.n_delivered,
        redelivered: info.n_redelivered,
        acked: info.n_acked,
        dead_lettered: info.n_dead_lettered,
    }
}

/// An ack kind from the wire.
pub fn ack_kind(item: &v1::AckItem) -> Result<AckKind, Status> {
    Ok(match enum_value::<v1::AckKind>("kind", item.kind)? {
        v1::AckKind::AckApplied => AckKind::Applied,
        v1::AckKind::AckReceived => AckKind::Received,
        v1::AckKind::AckInProgress => AckKind::InProgress,
        v1::AckKind::AckReplicated => AckKind::Replicated,
        v1::AckKind::AckFailed => AckKind::Failed,
        v1::AckKind::AckNack => AckKind::Nack { delay_ms: item.delay_ms },
        v1::AckKind::AckTerm => AckKind::Term,
    })
}

/// An ack state for the wire.
pub fn ack_state_to_wire(state: AckState) -> v1::AckState {
    match state {
        AckState::Received => v1::AckState::StateReceived,
        AckState::Applied => v1::AckState::StateApplied,
        AckState::Failed => v1::AckState::StateFailed,
        AckState::Nack => v1::AckState::StateNack,
        AckState::Replicated => v1::AckState::StateReplicated,
    }
}

/// Grants from the wire; the core validates them.
pub fn grants(grants: v1::Grants) -> Grants {
    let v1::Grants { publish, subscribe, consume, admin, cluster_admin } = grants;
    Grants { publish, subscribe, consume, admin, cluster_admin }
}

/// A principal of `cell`, its grants, how many tokens it holds and the streams it may mirror, for the wire.
pub fn principal_to_wire(cell: &cellog_core::Cell, (name, grants, tokens): (Arc<str>, Grants, usize)) -> v1::Principal {
    let Grants { publish, subscribe, consume, admin, cluster_admin } = grants;
    v1::Principal {
        mirror: cell.mirror_grants(&name).map(|streams| streams.iter().cloned().collect()).unwrap_or_default(),
        name: name.to_string(),
        grants: Some(v1::Grants { publish, subscribe, consume, admin, cluster_admin }),
        tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
    }
}

/// A token's SHA-256 from the wire: exactly 32 bytes.
pub fn token_hash(bytes: &[u8]) -> Result<TokenHash, Status> {
    let hash: [u8; 32] = bytes
        .try_into()
        .map_err(|_| invalid_argument(format!("a token's SHA-256 is 32 bytes, not {}", bytes.len())))?;
    Ok(TokenHash(hash))
}

/// A group strategy from the wire.
pub fn strategy(value: i32) -> Result<Strategy, Status> {
    Ok(match enum_value::<v1::GroupStrategy>("strategy", value)? {
        v1::GroupStrategy::StrategyRange => Strategy::Range,
        v1::GroupStrategy::StrategyRoundRobin => Strategy::RoundRobin,
        v1::GroupStrategy::StrategySticky => Strategy::Sticky,
        v1::GroupStrategy::StrategyCooperativeSticky => Strategy::CooperativeSticky,
    })
}

/// A group strategy for the wire.
pub fn strategy_to_wire(strategy: Strategy) -> v1::GroupStrategy {
    match strategy {
        Strategy::Range => v1::GroupStrategy::StrategyRange,
        Strategy::RoundRobin => v1::GroupStrategy::StrategyRoundRobin,
        Strategy::Sticky => v1::GroupStrategy::StrategySticky,
        Strategy::CooperativeSticky => v1::GroupStrategy::StrategyCooperativeSticky,
    }
}

/// A member's assignment for the wire.
pub fn assignment_to_wire(assignment: MemberAssignment) -> v1::GroupAssignment {
    v1::GroupAssignment {
        generation: assignment.generation,
        partitions: assignment.partitions,
        revoking: assignment.revoking,
        pending: assignment.pending,
        session_timeout_ms: assignment.session_timeout_ms,
    }
}

/// A group's info for the wire, with its consumer's lag per partition.
pub fn group_info_to_wire(stream: &str, info: GroupInfo) -> v1::GroupInfo {
    let lag: std::collections::BTreeMap<u32, (u64, u64)> =
        info.consumer.partitions.iter().map(|p| (p.partition, (p.lag, p.ack_floor))).collect();
    let name = |member: Option<Arc<str>>| member.map_or(String::new(), |m| m.to_string());
    v1::GroupInfo {
        stream: stream.to_string(),
        name: info.name.to_string(),
        strategy: strategy_to_wire(info.strategy) as i32,
        generation: info.generation,
        rebalancing: info.rebalancing,
        rebalances: info.n_rebalances,
        members: info
            .members
            .into_iter()
            .map(|member| v1::GroupMember {
                name: member.name.to_string(),
                assignment: Some(assignment_to_wire(member.assignment)),
                joined_at_ms: member.joined_at.0,
                expires_at_ms: member.expires_at.0,
            })
            .collect(),
        partitions: info
            .partitions
            .into_iter()
            .map(|p| {
                let (lag, ack_floor) = lag.get(&p.partition).copied().unwrap_or_default();
                v1::PartitionOwner {
                    partition: p.partition,
                    owner: name(p.owner),
                    granted_at: p.granted_at,
                    assignee: name(p.assignee),
                    lag,
                    ack_floor,
                }
            })
            .collect(),
        consumer: Some(consumer_info_to_wire(stream, info.consumer)),
    }
}

/// A placement for the wire.
pub fn placement_to_wire(stream: &str, placement: &Placement) -> v1::Placement {
    v1::Placement {
        stream: stream.to_string(),
        cell: placement.cell.to_string(),
        epoch: placement.epoch,
        moving_from: placement.moving_from.as_deref().map(str::to_string),
    }
}

/// A stream's ownership on this cell for the wire.
pub fn ownership_to_wire(stream: &str, ownership: &Ownership, last_seqs: Vec<u64>) -> v1::StreamOwnership {
    let (state, cell) = match ownership {
        Ownership::Owned { .. } => (v1::OwnershipState::OwnershipOwned, String::new()),
        Ownership::Receiving { from, .. } => (v1::OwnershipState::OwnershipReceiving, from.to_string()),
        Ownership::Moved { to, .. } => (v1::OwnershipState::OwnershipMoved, to.to_string()),
    };
    v1::StreamOwnership { stream: stream.to_string(), state: state.into(), epoch: ownership.epoch(), cell, last_seqs }
}

/// A message copied into a stream moving here, from the wire: its position and what a publish carries (its
/// `recalled_at_ms` and `stored_at_ms` are the other cell's and are not looked at).
pub fn ingested(message: v1::Message) -> IngestMessage {
    let request = PublishRequest {
        subject: message.subject,
        payload: message.payload,
        key: message.key,
        msg_id: message.msg_id,
        headers: message.headers,
        ..PublishRequest::default()
    };
    IngestMessage { partition: message.partition, seq: message.seq, request }
}
