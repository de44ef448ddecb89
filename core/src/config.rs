//! Stream and consumer configuration, with the validation that turns a bad config into a typed rejection.

use serde::{Deserialize, Serialize};

use crate::error::{NameKind, Rejection};
use crate::snapshot::v3;
use crate::subject::{filters_overlap, validate_filter, validate_scoped_name};
use crate::time::Millis;

/// Most partitions a stream may have.
pub const MAX_PARTITIONS: u32 = 1024;
/// Most subject filters a stream may claim.
pub const MAX_STREAM_SUBJECTS: usize = 64;
/// The largest `max_payload_bytes` a stream may set (8 MiB).
pub const MAX_PAYLOAD_LIMIT: u32 = 8 * 1024 * 1024;
/// Default payload limit (1 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 1024 * 1024;
/// Default window in which a repeated message id is a duplicate even after the message itself is gone (2 minutes).
pub const DEFAULT_DUPLICATE_WINDOW_MS: u64 = 120_000;
/// Longest ack wait, nack delay, TTL, delivery delay or transaction timeout accepted (one year).
pub const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;

/// When messages leave a stream besides its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RetentionPolicy {
    /// Only the limits (age, count, bytes, per subject) remove messages.
    #[default]
    Limits,
    /// A message is removed once every consumer of the stream has acknowledged it (or filters it out). With no
    /// consumer at all, messages wait.
    Interest,
    /// Like interest, for streams used as queues: consumers may not overlap, so each message has exactly one
    /// consumer and is removed once that consumer acknowledges it.
    WorkQueue,
}

/// What a full stream does with a new message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DiscardPolicy {
    /// Remove the oldest messages to make room (per subject: keep only the newest, "newest wins").
    #[default]
    Old,
    /// Refuse the new message with `QuotaExceeded`.
    New,
}

/// A token bucket: `messages_per_second` refill, up to `burst` saved tokens. Refilled from cell time, so every
/// replica computes the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Sustained rate.
    pub messages_per_second: u32,
    /// Largest burst; the bucket starts full.
    pub burst: u32,
}

/// A stream's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    /// Subject filters this stream claims. No two streams may claim overlapping filters.
    pub subjects: Vec<String>,
    /// Number of partitions; fixed for the life of the stream, since keys hash onto it.
    pub partitions: u32,
    /// Retention policy; fixed for the life of the stream.
    pub retention: RetentionPolicy,
    /// What happens when a limit is reached.
    pub discard: DiscardPolicy,
    /// Messages older than this are removed.
    pub max_age_ms: Option<u64>,
    /// Most messages in the stream.
    pub max_messages: Option<u64>,
    /// Most bytes (subject plus payload) in the stream.
    pub max_bytes: Option<u64>,
    /// Most messages per subject; with `DiscardPolicy::Old` and 1 this is a newest-wins (last value) stream.
    pub max_messages_per_subject: Option<u64>,
    /// Most bytes per subject.
    pub max_bytes_per_subject: Option<u64>,
    /// Largest payload accepted.
    pub max_payload_bytes: u32,
    /// How long a message id is remembered after its message is gone. While a message is retained its id is always
    /// remembered, so the dedup horizon is never shorter than retention.
    pub duplicate_window_ms: u64,
    /// Publish rate limit.
    pub rate_limit: Option<RateLimit>,
    /// The stream that receives messages that exhausted `max_deliver` or failed, with their origin in headers.
    pub dead_letter_stream: Option<String>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            subjects: Vec::new(),
            partitions: 1,
            retention: RetentionPolicy::Limits,
            discard: DiscardPolicy::Old,
            max_age_ms: None,
            max_messages: None,
            max_bytes: None,
            max_messages_per_subject: None,
            max_bytes_per_subject: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            duplicate_window_ms: DEFAULT_DUPLICATE_WINDOW_MS,
            rate_limit: None,
            dead_letter_stream: None,
        }
    }
}

impl From<v3::RetentionPolicy> for RetentionPolicy {
    fn from(retention: v3::RetentionPolicy) -> Self {
        match retention {
            v3::RetentionPolicy::Limits => RetentionPolicy::Limits,
            v3::RetentionPolicy::Interest => RetentionPolicy::Interest,
            v3::RetentionPolicy::WorkQueue => RetentionPolicy::WorkQueue,
        }
    }
}

impl From<v3::DiscardPolicy> for DiscardPolicy {
    fn from(discard: v3::DiscardPolicy) -> Self {
        match discard {
            v3::DiscardPolicy::Old => DiscardPolicy::Old,
            v3::DiscardPolicy::New => DiscardPolicy::New,
        }
    }
}

impl From<v3::RateLimit> for RateLimit {
    fn from(rate: v3::RateLimit) -> Self {
        RateLimit { messages_per_second: rate.messages_per_second, burst: rate.burst }
    }
}

impl From<v3::StreamConfig> for StreamConfig {
    fn from(config: v3::StreamConfig) -> Self {
        StreamConfig {
            subjects: config.subjects,
            partitions: config.partitions,
            retention: config.retention.into(),
            discard: config.discard.into(),
            max_age_ms: config.max_age_ms,
            max_messages: config.max_messages,
            max_bytes: config.max_bytes,
            max_messages_per_subject: config.max_messages_per_subject,
            max_bytes_per_subject: config.max_bytes_per_subject,
            max_payload_bytes: config.max_payload_bytes,
            duplicate_window_ms: config.duplicate_window_ms,
            rate_limit: config.rate_limit.map(RateLimit::from),
            dead_letter_stream: config.dead_letter_stream,
        }
    }
}

fn invalid(reason: impl Into<String>) -> Rejection {
    Rejection::InvalidConfig { reason: reason.into() }
}

fn positive(name: &str, value: Option<u64>) -> Result<(), Rejection> {
    match value {
        Some(0) => Err(invalid(format!("{name} must be at least 1 when set"))),
        _ => Ok(()),
    }
}

impl StreamConfig {
    /// A config claiming `subjects`, everything else default.
    pub fn with_subjects<S: Into<String>>(subjects: impl IntoIterator<Item = S>) -> Self {
        StreamConfig { subjects: subjects.into_iter().map(Into::into).collect(), ..StreamConfig::default() }
    }

    /// Checks the config on its own (not against other streams).
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.subjects.is_empty() {
            return Err(invalid("a stream must claim at least one subject"));
        }
        if self.subjects.len() > MAX_STREAM_SUBJECTS {
            return Err(invalid(format!("a stream may claim at most {MAX_STREAM_SUBJECTS} subjects")));
        }
        for (index, subject) in self.subjects.iter().enumerate() {
            validate_filter(subject)
                .map_err(|reason| Rejection::InvalidSubject { subject: subject.clone(), reason })?;
            if let Some(other) = self.subjects[..index].iter().find(|other| filters_overlap(other, subject)) {
                return Err(invalid(format!("subjects {other:?} and {subject:?} overlap")));
            }
        }
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(invalid(format!("partitions must be between 1 and {MAX_PARTITIONS}")));
        }
        positive("max_age_ms", self.max_age_ms)?;
        positive("max_messages", self.max_messages)?;
        positive("max_bytes", self.max_bytes)?;
        positive("max_messages_per_subject", self.max_messages_per_subject)?;
        positive("max_bytes_per_subject", self.max_bytes_per_subject)?;
        if self.max_age_ms.is_some_and(|age| age > MAX_DURATION_MS) {
            return Err(invalid(format!("max_age_ms may be at most {MAX_DURATION_MS}")));
        }
        if self.duplicate_window_ms > MAX_DURATION_MS {
            return Err(invalid(format!("duplicate_window_ms may be at most {MAX_DURATION_MS}")));
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return Err(invalid(format!("max_payload_bytes must be between 1 and {MAX_PAYLOAD_LIMIT}")));
        }
        if let Some(rate) = self.rate_limit
            && (rate.messages_per_second == 0 || rate.burst == 0)
        {
            return Err(invalid("rate_limit needs messages_per_second and burst of at least 1"));
        }
        if let Some(name) = &self.dead_letter_stream {
            validate_scoped_name(name).map_err(|reason| Rejection::InvalidName {
                kind: NameKind::Stream,
                name: name.clone(),
                reason,
            })?;
        }
        Ok(())
    }
}

/// Where a new consumer starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliverPolicy {
    /// From the oldest retained message (the default: work published before the consumer existed is not lost).
    #[default]
    All,
    /// Only messages published after the consumer is created.
    New,
    /// From this sequence in every partition (or the oldest retained, if later).
    FromSequence(u64),
    /// From the first message stored at or after this time.
    FromTime(Millis),
}

/// A durable consumer's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerConfig {
    /// Only subjects matching this filter are delivered; others are skipped.
    pub filter_subject: Option<String>,
    /// Where the consumer starts.
    pub deliver_policy: DeliverPolicy,
    /// How long a delivery may stay unacknowledged before it becomes a redelivery candidate.
    pub ack_wait_ms: u64,
    /// Deliveries after which a message goes to the dead-letter stream instead of back to the consumer.
    pub max_deliver: Option<u32>,
    /// Most deliveries outstanding (delivered, not yet acknowledged) at once.
    pub max_in_flight: u32,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            filter_subject: None,
            deliver_policy: DeliverPolicy::All,
            ack_wait_ms: 30_000,
            max_deliver: None,
            max_in_flight: 1000,
        }
    }
}

impl From<v3::DeliverPolicy> for DeliverPolicy {
    fn from(policy: v3::DeliverPolicy) -> Self {
        match policy {
            v3::DeliverPolicy::All => DeliverPolicy::All,
            v3::DeliverPolicy::New => DeliverPolicy::New,
            v3::DeliverPolicy::FromSequence(seq) => DeliverPolicy::FromSequence(seq),
            v3::DeliverPolicy::FromTime(time) => DeliverPolicy::FromTime(time.into()),
        }
    }
}

impl From<v3::ConsumerConfig> for ConsumerConfig {
    fn from(config: v3::ConsumerConfig) -> Self {
        ConsumerConfig {
            filter_subject: config.filter_subject,
            deliver_policy: config.deliver_policy.into(),
            ack_wait_ms: config.ack_wait_ms,
            max_deliver: config.max_deliver,
            max_in_flight: config.max_in_flight,
        }
    }
}

/// Most deliveries outstanding per consumer.
pub const MAX_IN_FLIGHT_LIMIT: u32 = 100_000;

impl ConsumerConfig {
    /// Checks the config on its own.
    pub fn validate(&self) -> Result<(), Rejection> {
        if let Some(filter) = &self.filter_subject {
            validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason })?;
        }
        if self.ack_wait_ms == 0 || self.ack_wait_ms > MAX_DURATION_MS {
            return Err(invalid(format!("ack_wait_ms must be between 1 and {MAX_DURATION_MS}")));
        }
        if self.max_deliver == Some(0) {
            return Err(invalid("max_deliver must be at least 1 when set"));
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT_LIMIT {
            return Err(invalid(format!("max_in_flight must be between 1 and {MAX_IN_FLIGHT_LIMIT}")));
        }
        Ok(())
    }
}
