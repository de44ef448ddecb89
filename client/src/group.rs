//! A consumer group's member: joins, keeps its session with heartbeats, tells the application which partitions it was
//! assigned and which it must give up, and gives them up only after the application has been told (so every ack it
//! made of them has been answered, and the next owner starts after them).
//!
//! ```text
//! join ──▶ assignment ──▶ fetch / ack ... ──▶ heartbeat (every `heartbeat_every`, or when a fetch shows a newer
//!                               ▲              generation) ──▶ revoked(p) ──▶ heartbeat releasing p
//!                               └──────────────────────────── assigned(q) ◀──┘
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "heartbeats are spaced on the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::collections::BTreeSet;
use std::time::Duration;

use cellog_proto::v1;
use tokio::time::Instant;

use crate::client::{Client, ClientError};

/// What the application hears of its partitions.
pub trait Rebalance: Send {
    /// The member now owns these partitions and fetches from them.
    fn assigned(&mut self, _partitions: &[u32]) {}
    /// The member must give these partitions up: stop working on them and ack what is done before returning. Once it
    /// returns, the member releases them and their unacknowledged deliveries go to the next owner.
    fn revoked(&mut self, _partitions: &[u32]) {}
}

/// A [`Rebalance`] that does nothing.
pub struct Quiet;

impl Rebalance for Quiet {}

/// How a member joins.
#[derive(Clone, Debug)]
pub struct MemberOptions {
    /// The group's strategy.
    pub strategy: v1::GroupStrategy,
    /// How long the cell waits for a heartbeat before it removes the member.
    pub session_timeout: Duration,
    /// How often the member heartbeats (a third of the session timeout by default).
    pub heartbeat_every: Duration,
    /// The group's consumer.
    pub config: v1::ConsumerConfig,
}

impl Default for MemberOptions {
    fn default() -> Self {
        MemberOptions {
            strategy: v1::GroupStrategy::StrategyCooperativeSticky,
            session_timeout: Duration::from_secs(10),
            heartbeat_every: Duration::from_millis(3_333),
            config: v1::ConsumerConfig::default(),
        }
    }
}

/// One member of a consumer group.
pub struct GroupMember {
    client: Client,
    stream: String,
    group: String,
    member: String,
    options: MemberOptions,
    /// The generation of the last assignment it acted on.
    generation: u64,
    /// The partitions it fetches from, as far as the application has been told.
    owned: BTreeSet<u32>,
    /// A newer generation was seen: heartbeat at the next chance.
    stale: bool,
    next_heartbeat: Instant,
}

impl GroupMember {
    /// Joins `group` on `stream` as `member`, telling `listener` what it owns.
    pub async fn join(
        client: Client,
        stream: &str,
        group: &str,
        member: &str,
        options: MemberOptions,
        listener: &mut impl Rebalance,
    ) -> Result<Self, ClientError> {
        let request = v1::JoinGroupRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            strategy: options.strategy as i32,
            session_timeout_ms: u64::try_from(options.session_timeout.as_millis()).unwrap_or(u64::MAX),
            config: Some(options.config.clone()),
        };
        let assignment = client.join_group(request).await?;
        let mut this = GroupMember {
            client,
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            next_heartbeat: Instant::now() + options.heartbeat_every,
            options,
            generation: 0,
            owned: BTreeSet::new(),
            stale: false,
        };
        this.adopt(assignment, listener).await?;
        Ok(this)
    }

    /// The generation it acts at.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The partitions it fetches from.
    pub fn partitions(&self) -> &BTreeSet<u32> {
        &self.owned
    }

    /// Heartbeats if one is due (or a newer generation was seen), telling `listener` of every change.
    pub async fn poll(&mut self, listener: &mut impl Rebalance) -> Result<(), ClientError> {
        if self.stale || Instant::now() >= self.next_heartbeat {
            self.heartbeat(listener).await?;
        }
        Ok(())
    }

    /// Heartbeats now: takes the current assignment, gives up what it must (after telling `listener`), and keeps
    /// doing so until nothing is left to give up.
    pub async fn heartbeat(&mut self, listener: &mut impl Rebalance) -> Result<(), ClientError> {
        let assignment =
            self.client.heartbeat(&self.stream, &self.group, &self.member, self.generation, Vec::new()).await?;
        self.adopt(assignment, listener).await
    }

    /// Acts on an assignment: revoked partitions are handed to `listener` and released, new ones announced.
    async fn adopt(
        &mut self,
        mut assignment: v1::GroupAssignment,
        listener: &mut impl Rebalance,
    ) -> Result<(), ClientError> {
        // Each round releases what the last answer said to give up; the answer to the release says what is next.
        for _ in 0..4 {
            let revoking: Vec<u32> = assignment.revoking.clone();
            let lost: Vec<u32> = self.owned.iter().copied().filter(|p| !assignment.partitions.contains(p)).collect();
            if !lost.is_empty() {
                listener.revoked(&lost);
                for p in &lost {
                    self.owned.remove(p);
                }
            }
            if revoking.is_empty() {
                break;
            }
            assignment =
                self.client.heartbeat(&self.stream, &self.group, &self.member, assignment.generation, revoking).await?;
        }
        let gained: Vec<u32> = assignment.partitions.iter().copied().filter(|p| !self.owned.contains(p)).collect();
        self.generation = assignment.generation;
        if !gained.is_empty() {
            self.owned.extend(&gained);
            listener.assigned(&gained);
        }
        self.stale = false;
        self.next_heartbeat = Instant::now() + self.options.heartbeat_every;
        Ok(())
    }

    /// Takes up to `max` deliveries from its partitions (heartbeating first if one is due).
    pub async fn fetch(&mut self, max: u32, listener: &mut impl Rebalance) -> Result<Vec<v1::Delivery>, ClientError> {
        self.poll(listener).await?;
        let answer = self.client.member_fetch(&self.stream, &self.group, &self.member, self.generation, max).await?;
        if answer.generation > self.generation {
            self.stale = true;
        }
        Ok(answer.deliveries)
    }

    /// Acks deliveries at its generation; one result per item.
    pub async fn ack(&self, acks: Vec<v1::AckItem>) -> Result<Vec<v1::AckResult>, ClientError> {
        self.client.member_ack(&self.stream, &self.group, &self.member, self.generation, acks).await
    }

    /// Commits a partition's position at its generation.
    pub async fn commit(&self, partition: u32, next_seq: u64) -> Result<u64, ClientError> {
        self.client.member_commit(&self.stream, &self.group, &self.member, self.generation, partition, next_seq).await
    }

    /// Opens a push subscription of its partitions at its generation; it ends when the generation moves (heartbeat,
    /// then subscribe again).
    pub async fn subscribe(&self, max_in_flight: u32) -> Result<tonic::Streaming<v1::Delivery>, ClientError> {
        self.client
            .member_subscribe(v1::MemberSubscribeRequest {
                stream: self.stream.clone(),
                group: self.group.clone(),
                member: self.member.clone(),
                generation: self.generation,
                max_in_flight,
            })
            .await
    }

    /// Leaves the group, telling `listener` that everything is given up.
    pub async fn leave(mut self, listener: &mut impl Rebalance) -> Result<bool, ClientError> {
        let owned: Vec<u32> = std::mem::take(&mut self.owned).into_iter().collect();
        if !owned.is_empty() {
            listener.revoked(&owned);
        }
        self.client.leave_group(&self.stream, &self.group, &self.member).await
    }
}
