//! Consumer groups: joining, heartbeats and releases, leaving, session expiry, and a member's fetches, acks and commits
//! (see [`crate::group`] for the protocol).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Cell;
use super::limits::{MAX_GROUP_MEMBERS, invalid};
use crate::command::Strategy;
use crate::config::ConsumerConfig;
use crate::effect::Transition;
use crate::error::{Cap, Rejection};
use crate::group::{Changes, Group, GroupInfo};
use crate::outcome::{GroupChange, Outcome};
use crate::time::Millis;

/// A group's key: (stream, group).
type GroupKey = (Arc<str>, Arc<str>);

/// Who owns what and who is revoking what, to tell a generation's changes apart.
type Holdings = BTreeMap<(Arc<str>, u32), bool>;

fn holdings(group: &Group) -> Holdings {
    let mut held = Holdings::new();
    for name in group.members.keys() {
        let assignment = group.assignment_of(name).expect("a member");
        for partition in assignment.partitions {
            held.insert((name.clone(), partition), false);
        }
        for partition in assignment.revoking {
            held.insert((name.clone(), partition), true);
        }
    }
    held
}

impl Cell {
    fn group_key(&self, stream: &str, group: &str) -> Result<GroupKey, Rejection> {
        let stream_name = self.stream(stream)?.name().clone();
        let key = (stream_name, Arc::from(group));
        if !self.groups.contains_key(&key) {
            return Err(Rejection::GroupNotFound { stream: stream.to_string(), group: group.to_string() });
        }
        Ok(key)
    }

    /// Refuses a plain fetch, ack or commit on a group's consumer: a group's partitions are touched by their owners
    /// only.
    pub(super) fn refuse_group_consumer(&self, stream: &str, consumer: &str) -> Result<(), Rejection> {
        // On the path of every fetch, ack and commit: a cell without groups asks nothing more (the lookup allocates
        // its key).
        if self.groups.is_empty() {
            return Ok(());
        }
        if self.groups.contains_key(&(Arc::from(stream), Arc::from(consumer))) {
            return Err(invalid(format!(
                "consumer {consumer:?} of stream {stream:?} is a consumer group's: fetch, ack and commit as its member"
            )));
        }
        Ok(())
    }

    /// Refuses an ack or commit by `member` knowing `generation` on a partition it does not own since then.
    pub(super) fn check_member_owns(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        partition: u32,
    ) -> Result<(), Rejection> {
        let key = self.group_key(stream, group)?;
        let g = &self.groups[&key];
        if partition >= g.n_partitions {
            return Err(invalid(format!("stream {stream:?} has no partition {partition}")));
        }
        g.check_owner(group, member, generation, partition)
    }

    #[allow(clippy::too_many_arguments, reason = "one argument per field of the command")]
    pub(super) fn join_group(
        &mut self,
        at: Millis,
        stream: &str,
        group: &str,
        member: &str,
        strategy: Strategy,
        session_timeout_ms: u64,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        let s = self.stream(stream)?;
        let key = (s.name().clone(), Arc::from(group));
        let n_partitions = s.config().partitions;
        match self.groups.get(&key) {
            Some(existing) => {
                if existing.strategy != strategy {
                    return Err(Rejection::InvalidConfig {
                        reason: format!(
                            "group {group:?} uses the {} strategy; every member must name the same",
                            existing.strategy
                        ),
                    });
                }
                if *s.consumer(group)?.config() != config {
                    return Err(Rejection::Conflict { what: "group".to_string(), name: group.to_string() });
                }
                if !existing.members.contains_key(member) && existing.members.len() >= MAX_GROUP_MEMBERS {
                    return Err(Rejection::CapReached { cap: Cap::GroupMembers, limit: MAX_GROUP_MEMBERS as u64 });
                }
            }
            None => {
                if s.consumer(group).is_ok() {
                    return Err(Rejection::InvalidConfig {
                        reason: format!("stream {stream:?} has a consumer {group:?} that is not a group"),
                    });
                }
                // Every check of a new consumer (its filter, the stream's cap, a work queue's overlaps) before the
                // group exists: a refusal leaves nothing behind.
                self.create_consumer(at, stream, group.to_string(), config)?;
                self.groups.insert(key.clone(), Group::new(strategy, n_partitions, at));
            }
        }
        let member: Arc<str> = Arc::from(member);
        let changes =
            self.change_group(&key, &member, GroupChange::Joined, |g| g.join(member.clone(), session_timeout_ms, at));
        debug_assert!(changes.bumped);
        let g = &self.groups[&key];
        self.members_expire_from.0 = self.members_expire_from.0.min(g.members[&member].expires_at);
        Ok(Outcome::GroupAssignment(g.assignment_of(&member).expect("just joined")))
    }

    pub(super) fn heartbeat(
        &mut self,
        at: Millis,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        released: &[u32],
    ) -> Result<Outcome, Rejection> {
        let key = self.group_key(stream, group)?;
        let g = &self.groups[&key];
        g.check_member(group, member, generation)?;
        if let Some(&partition) = released.iter().find(|&&partition| partition >= g.n_partitions) {
            return Err(invalid(format!("stream {stream:?} has no partition {partition}")));
        }
        let member: Arc<str> = Arc::from(member);
        self.groups.get_mut(&key).expect("checked").heartbeat(&member, at);
        if !released.is_empty() {
            self.change_group(&key, &member, GroupChange::Released, |g| g.release(&member, released, generation));
        }
        let g = &self.groups[&key];
        Ok(Outcome::GroupAssignment(g.assignment_of(&member).expect("a member")))
    }

    pub(super) fn leave_group(&mut self, stream: &str, group: &str, member: &str) -> Result<Outcome, Rejection> {
        let key = self.group_key(stream, group)?;
        if !self.groups[&key].members.contains_key(member) {
            return Ok(Outcome::GroupLeft { was_member: false });
        }
        let member: Arc<str> = Arc::from(member);
        self.change_group(&key, &member, GroupChange::Left, |g| g.remove(&member).expect("a member"));
        Ok(Outcome::GroupLeft { was_member: true })
    }

    pub(super) fn member_fetch(
        &mut self,
        at: Millis,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        max: u32,
    ) -> Result<Outcome, Rejection> {
        let key = self.group_key(stream, group)?;
        let g = self.groups.get_mut(&key).expect("checked");
        g.check_member(group, member, generation)?;
        // A fetch shows the member alive as a heartbeat does.
        g.heartbeat(member, at);
        let current = g.generation;
        let only = g.fetchable_at(member, generation);
        let deliveries =
            if only.is_empty() { Vec::new() } else { self.fetch(at, stream, group, member, max, Some(&only))? };
        Ok(Outcome::MemberFetched { generation: current, deliveries })
    }

    /// Runs `change` on a group, hands the partitions it released back to the group's consumer for redelivery, and
    /// reports the new generation.
    fn change_group(
        &mut self,
        key: &GroupKey,
        member: &Arc<str>,
        why: GroupChange,
        change: impl FnOnce(&mut Group) -> Changes,
    ) -> Changes {
        let g = self.groups.get_mut(key).expect("the group exists");
        let before = holdings(g);
        let changes = change(g);
        if !changes.bumped {
            return changes;
        }
        let after = holdings(g);
        let generation = g.generation;
        let granted = after.keys().filter(|held| !before.contains_key(*held)).cloned().collect();
        let revoking = after
            .iter()
            .filter(|&(held, &revoking)| revoking && before.get(held) != Some(&true))
            .map(|(held, _)| held.clone())
            .collect();
        let s = self.streams.get_mut(&key.0).expect("a group's stream exists");
        let consumer = s.consumer_mut(&key.1).expect("a group's consumer exists");
        let released: BTreeSet<u32> = changes.released.iter().copied().collect();
        for &partition in &released {
            consumer.release_partition(partition);
        }
        self.effects.note(|| Transition::GroupChanged {
            stream: key.0.clone(),
            group: key.1.clone(),
            generation,
            member: member.clone(),
            change: why,
            granted,
            revoking,
            released: released.into_iter().collect(),
        });
        changes
    }

    /// The earliest end of any member's session.
    pub(super) fn earliest_member_expiry(&self) -> Millis {
        self.groups.values().filter_map(Group::earliest_expiry).min().unwrap_or(Millis::MAX)
    }

    /// Removes every member whose session ended by `at`. Looks only once the derived lower bound has come.
    pub(super) fn expire_group_members(&mut self, at: Millis) {
        if at < self.members_expire_from.0 {
            return;
        }
        let expired: Vec<(GroupKey, Arc<str>)> = self
            .groups
            .iter()
            .flat_map(|(key, group)| group.expired(at).into_iter().map(|member| (key.clone(), member)))
            .collect();
        for (key, member) in expired {
            self.change_group(&key, &member, GroupChange::Expired, |g| g.remove(&member).expect("listed above"));
        }
        self.members_expire_from.0 = self.earliest_member_expiry();
    }

    /// Drops a deleted stream's groups.
    pub(super) fn forget_groups_of(&mut self, stream: &str) {
        self.groups.retain(|(s, _), _| &**s != stream);
    }

    /// What a fetch by `member` knowing `generation` would do now (see [`crate::Work`]), how many of the member's
    /// deliveries await its ack, and the group's generation: for a member's subscription, as [`Cell::consumer_work`]
    /// is for a consumer's.
    pub fn member_work(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
    ) -> Result<(crate::Work, u32, u64), Rejection> {
        let key = self.group_key(stream, group)?;
        let g = &self.groups[&key];
        g.check_member(group, member, generation)?;
        let only = g.fetchable_at(member, generation);
        let (room, per_subject) = self.in_flight_caps(stream);
        let s = self.stream(stream)?;
        let consumer = s.consumer(group)?;
        let work = if only.is_empty() || room == 0 {
            crate::Work::None
        } else {
            consumer.work(s.partitions(), s.subjects(), Some(&only), per_subject)
        };
        Ok((work, consumer.n_pending_of(member, &only), g.generation))
    }

    /// The names of a stream's groups, in order.
    pub fn group_names(&self, stream: &str) -> Result<Vec<Arc<str>>, Rejection> {
        let name = self.stream(stream)?.name().clone();
        let groups = self.groups.range((name.clone(), Arc::from(""))..).take_while(|((s, _), _)| *s == name);
        Ok(groups.map(|((_, g), _)| g.clone()).collect())
    }

    /// A group's members, generation, assignment and owners, with each partition's position and lag, as of `now`.
    pub fn group_info(&self, stream: &str, group: &str, now: Millis) -> Result<GroupInfo, Rejection> {
        let key = self.group_key(stream, group)?;
        let s = self.stream(stream)?;
        let consumer = s.consumer(group)?.info(s.partitions(), now);
        Ok(self.groups[&key].info(&key.1, consumer))
    }
}
