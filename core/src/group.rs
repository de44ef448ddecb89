//! Consumer groups: members that share a stream's partitions, one owner per partition, and the four strategies that
//! decide who owns what.
//!
//! A group consumes one stream through a durable consumer of the same name (its cursors, outstanding deliveries,
//! redelivery and dead letters are the consumer's). The group adds who may touch which partition:
//! - each member has an *assignment* (the partitions the strategy gives it) and *owns* some partitions, each since
//!   the generation it was granted at;
//! - a member fetches only from partitions it owns and is assigned; it may still ack and commit a partition it owns
//!   but is no longer assigned (*revoking*) until it releases it; a partition it is assigned but does not own yet
//!   (*pending*) waits until its previous owner releases it or leaves;
//! - a partition is granted only when nobody owns it, so no two members ever own one partition.
//!
//! Eager strategies (range, round-robin, sticky) revoke every owned partition at a change of membership and grant the
//! new assignment once all are released. Cooperative sticky revokes only the partitions that move; everything else
//! stays owned and consumed throughout.
//!
//! The generation increases by one at every command that changes membership, an assignment or an owner. An ack,
//! nack or commit names the member and the generation it knows; it is refused unless the member owns the partition
//! and that generation is not older than the grant ([`Group::check_owner`]). A member that left, expired or
//! re-joined (a new incarnation) is fenced: its old grants are gone.
//!
//! Everything here is pure and ordered (`BTreeMap`, `BTreeSet`): every replica computes the same assignment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::Strategy;
use crate::error::Rejection;
use crate::info::ConsumerInfo;
use crate::outcome::MemberAssignment;
use crate::snapshot::v7;
use crate::time::Millis;

/// Partitions by member.
pub type Assignment = BTreeMap<Arc<str>, BTreeSet<u32>>;

/// The assignment `strategy` gives `members` over partitions `0..n_partitions`, `current` being what each member
/// owns now (only the sticky strategies look at it). Every partition goes to exactly one member (none with no
/// members), and the counts differ by at most one. Pure: the same arguments give the same assignment everywhere.
pub fn assign(strategy: Strategy, n_partitions: u32, members: &BTreeSet<Arc<str>>, current: &Assignment) -> Assignment {
    let mut assignment: Assignment = members.iter().map(|member| (member.clone(), BTreeSet::new())).collect();
    if members.is_empty() {
        return assignment;
    }
    let n_members = members.len() as u32;
    let (base, extra) = (n_partitions / n_members, n_partitions % n_members);
    match strategy {
        Strategy::Range => {
            let mut next = 0;
            for (index, member) in members.iter().enumerate() {
                let count = base + u32::from((index as u32) < extra);
                assignment.insert(member.clone(), (next..next + count).collect());
                next += count;
            }
        }
        Strategy::RoundRobin => {
            let members: Vec<&Arc<str>> = members.iter().collect();
            for partition in 0..n_partitions {
                let member = members[(partition % n_members) as usize];
                assignment.get_mut(member).expect("every member has an entry").insert(partition);
            }
        }
        Strategy::Sticky | Strategy::CooperativeSticky => {
            // The larger quotas go to the members that own the most, so the fewest partitions leave their owner: a
            // member gives up only what it owns past its quota.
            let owned = |member: &Arc<str>| current.get(member).map_or(0, BTreeSet::len);
            let mut by_owned: Vec<&Arc<str>> = members.iter().collect();
            by_owned.sort_by(|a, b| owned(b).cmp(&owned(a)).then_with(|| a.cmp(b)));
            let quota: BTreeMap<&Arc<str>, usize> = by_owned
                .iter()
                .enumerate()
                .map(|(rank, member)| (*member, (base + u32::from((rank as u32) < extra)) as usize))
                .collect();
            let mut free: BTreeSet<u32> = (0..n_partitions).collect();
            for member in members {
                let kept: BTreeSet<u32> = current
                    .get(member)
                    .into_iter()
                    .flatten()
                    .copied()
                    .filter(|&partition| partition < n_partitions && free.contains(&partition))
                    .take(quota[member])
                    .collect();
                for partition in &kept {
                    free.remove(partition);
                }
                assignment.insert(member.clone(), kept);
            }
            // What is left goes to the members still under quota, the emptiest first.
            let mut free = free.into_iter();
            loop {
                let short = assignment
                    .iter()
                    .filter(|(member, partitions)| partitions.len() < quota[member])
                    .min_by(|(a, pa), (b, pb)| pa.len().cmp(&pb.len()).then_with(|| a.cmp(b)))
                    .map(|(member, _)| member.clone());
                let (Some(member), Some(partition)) = (short, free.next()) else { break };
                assignment.get_mut(&member).expect("a member").insert(partition);
            }
        }
    }
    assignment
}

/// One member of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Member {
    pub joined_at: Millis,
    pub session_timeout_ms: u64,
    /// It is removed once the cell's time reaches this without a heartbeat.
    pub expires_at: Millis,
    /// The partitions the strategy gives it.
    pub assigned: BTreeSet<u32>,
    /// The partitions it owns, each with the generation it was granted at.
    pub owned: BTreeMap<u32, u64>,
}

/// A group's state: its members, their assignments and what each owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Group {
    pub strategy: Strategy,
    pub n_partitions: u32,
    pub generation: u64,
    pub members: BTreeMap<Arc<str>, Member>,
    /// An eager rebalance is under way: every owned partition is revoked, and nothing is granted until none is owned.
    pub revoking_all: bool,
    pub created_at: Millis,
    /// How many times the membership changed and the assignment was computed again.
    pub n_rebalances: u64,
}

/// A group as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The group's name (also its consumer's).
    pub name: Arc<str>,
    /// Its strategy.
    pub strategy: Strategy,
    /// Its generation.
    pub generation: u64,
    /// Whether a rebalance is under way: some partition is being revoked or waits for its new owner.
    pub rebalancing: bool,
    /// How many times its membership changed.
    pub n_rebalances: u64,
    /// When it was created.
    pub created_at: Millis,
    /// Its members, in name order.
    pub members: Vec<MemberInfo>,
    /// Each partition's owner and assignee.
    pub partitions: Vec<PartitionOwner>,
    /// Its consumer: positions, lag per partition, outstanding deliveries.
    pub consumer: ConsumerInfo,
}

/// One member as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its name.
    pub name: Arc<str>,
    /// When it (this incarnation) joined.
    pub joined_at: Millis,
    /// When its session ends without a heartbeat.
    pub expires_at: Millis,
    /// What it owns, gives up and waits for.
    pub assignment: MemberAssignment,
}

/// Who owns a partition, and who it is assigned to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOwner {
    /// The partition.
    pub partition: u32,
    /// The member that owns it, if any.
    pub owner: Option<Arc<str>>,
    /// The generation it was granted at (0 with no owner).
    pub granted_at: u64,
    /// The member the strategy assigns it to, if any.
    pub assignee: Option<Arc<str>>,
}

/// What changed in a group at one command.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Partitions whose owner gave them up (released, left or expired): their outstanding deliveries go back for
    /// redelivery to the next owner.
    pub released: Vec<u32>,
    /// Whether the generation moved.
    pub bumped: bool,
}

impl From<v7::Strategy> for Strategy {
    fn from(strategy: v7::Strategy) -> Self {
        match strategy {
            v7::Strategy::Range => Strategy::Range,
            v7::Strategy::RoundRobin => Strategy::RoundRobin,
            v7::Strategy::Sticky => Strategy::Sticky,
            v7::Strategy::CooperativeSticky => Strategy::CooperativeSticky,
        }
    }
}

impl From<v7::Group> for Group {
    fn from(group: v7::Group) -> Self {
        let v7::Group { strategy, n_partitions, generation, members, revoking_all, created_at, n_rebalances } = group;
        let members = members
            .into_iter()
            .map(|(name, member)| {
                let v7::Member { joined_at, session_timeout_ms, expires_at, assigned, owned } = member;
                let member = Member {
                    joined_at: joined_at.into(),
                    session_timeout_ms,
                    expires_at: expires_at.into(),
                    assigned,
                    owned,
                };
                (name, member)
            })
            .collect();
        Group {
            strategy: strategy.into(),
            n_partitions,
            generation,
            members,
            revoking_all,
            created_at: created_at.into(),
            n_rebalances,
        }
    }
}

impl Group {
    pub fn new(strategy: Strategy, n_partitions: u32, at: Millis) -> Self {
        Group {
            strategy,
            n_partitions,
            generation: 0,
            members: BTreeMap::new(),
            revoking_all: false,
            created_at: at,
            n_rebalances: 0,
        }
    }

    /// The group as operators see it, `consumer` being its consumer's info.
    pub fn info(&self, name: &Arc<str>, consumer: ConsumerInfo) -> GroupInfo {
        let mut partitions: Vec<PartitionOwner> = (0..self.n_partitions)
            .map(|partition| PartitionOwner { partition, owner: None, granted_at: 0, assignee: None })
            .collect();
        let mut members = Vec::new();
        let mut rebalancing = self.revoking_all;
        for (member_name, member) in &self.members {
            for (&partition, &granted) in &member.owned {
                if let Some(entry) = partitions.get_mut(partition as usize) {
                    entry.owner = Some(member_name.clone());
                    entry.granted_at = granted;
                }
            }
            for &partition in &member.assigned {
                if let Some(entry) = partitions.get_mut(partition as usize) {
                    entry.assignee = Some(member_name.clone());
                }
            }
            let assignment = self.assignment_of(member_name).expect("a member");
            rebalancing |= !assignment.revoking.is_empty() || !assignment.pending.is_empty();
            members.push(MemberInfo {
                name: member_name.clone(),
                joined_at: member.joined_at,
                expires_at: member.expires_at,
                assignment,
            });
        }
        GroupInfo {
            name: name.clone(),
            strategy: self.strategy,
            generation: self.generation,
            rebalancing,
            n_rebalances: self.n_rebalances,
            created_at: self.created_at,
            members,
            partitions,
            consumer,
        }
    }

    /// What `member` sees now.
    pub fn assignment_of(&self, name: &str) -> Option<MemberAssignment> {
        let member = self.members.get(name)?;
        let (mut partitions, mut revoking) = (Vec::new(), Vec::new());
        for &partition in member.owned.keys() {
            if self.fetchable(member, partition) {
                partitions.push(partition);
            } else {
                revoking.push(partition);
            }
        }
        let pending = member.assigned.iter().copied().filter(|p| !member.owned.contains_key(p)).collect();
        Some(MemberAssignment {
            generation: self.generation,
            partitions,
            revoking,
            pending,
            session_timeout_ms: member.session_timeout_ms,
        })
    }

    fn fetchable(&self, member: &Member, partition: u32) -> bool {
        !self.revoking_all && member.owned.contains_key(&partition) && member.assigned.contains(&partition)
    }

    /// The partitions `name` may fetch from with what it knows at `generation`: owned, assigned, not being revoked,
    /// and granted no later than that generation (a member does not get deliveries it could not yet ack).
    pub fn fetchable_at(&self, name: &str, generation: u64) -> BTreeSet<u32> {
        let Some(member) = self.members.get(name) else { return BTreeSet::new() };
        member
            .owned
            .iter()
            .filter(|&(&partition, &granted)| granted <= generation && self.fetchable(member, partition))
            .map(|(&partition, _)| partition)
            .collect()
    }

    /// Refuses an ack, nack or commit on `partition` by `name` knowing `generation`, unless it owns the partition and
    /// the generation is not older than the grant (nor newer than the group's).
    pub fn check_owner(&self, group: &str, name: &str, generation: u64, partition: u32) -> Result<(), Rejection> {
        let member = self.check_member(group, name, generation)?;
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::StaleGenerationAcked) {
            return Ok(());
        }
        match member.owned.get(&partition) {
            Some(&granted) if generation >= granted => Ok(()),
            _ => Err(Rejection::NotOwner {
                group: group.to_string(),
                member: name.to_string(),
                partition,
                generation: self.generation,
            }),
        }
    }

    /// Refuses a member the group does not have, and a generation the group has not reached.
    pub fn check_member(&self, group: &str, name: &str, generation: u64) -> Result<&Member, Rejection> {
        let unknown = || Rejection::UnknownMember {
            group: group.to_string(),
            member: name.to_string(),
            generation: self.generation,
        };
        let member = self.members.get(name).ok_or_else(unknown)?;
        if generation > self.generation {
            return Err(Rejection::Invalid {
                reason: format!(
                    "generation {generation} is ahead of group {group:?}, which is at generation {}",
                    self.generation
                ),
            });
        }
        Ok(member)
    }

    /// Adds `name` (or replaces its earlier incarnation, whose grants end) and rebalances.
    pub fn join(&mut self, name: Arc<str>, session_timeout_ms: u64, at: Millis) -> Changes {
        let mut changes = Changes::default();
        if let Some(old) = self.members.remove(&name) {
            changes.released.extend(old.owned.keys());
        }
        self.members.insert(
            name,
            Member {
                joined_at: at,
                session_timeout_ms,
                expires_at: at.plus(session_timeout_ms),
                assigned: BTreeSet::new(),
                owned: BTreeMap::new(),
            },
        );
        self.rebalance();
        self.settle(&mut changes, true);
        changes
    }

    /// Removes `name` (left, or its session expired): what it owned is released, and the rest rebalance.
    pub fn remove(&mut self, name: &str) -> Option<Changes> {
        let old = self.members.remove(name)?;
        let mut changes = Changes { released: old.owned.keys().copied().collect(), bumped: false };
        self.rebalance();
        self.settle(&mut changes, true);
        Some(changes)
    }

    /// `name`, knowing `generation`, gives up `partitions`: those it owns since that generation or earlier (a grant it
    /// has not seen yet is not given up by a late release); whatever is free then goes to its assignee.
    pub fn release(&mut self, name: &str, partitions: &[u32], generation: u64) -> Changes {
        let mut changes = Changes::default();
        if let Some(member) = self.members.get_mut(name) {
            for partition in partitions {
                if member.owned.get(partition).is_some_and(|&granted| granted <= generation) {
                    member.owned.remove(partition);
                    changes.released.push(*partition);
                }
            }
        }
        let released = !changes.released.is_empty();
        self.settle(&mut changes, released);
        changes
    }

    /// Keeps `name` alive until `at` plus its session timeout. Returns when it now expires.
    pub fn heartbeat(&mut self, name: &str, at: Millis) -> Option<Millis> {
        let member = self.members.get_mut(name)?;
        member.expires_at = at.plus(member.session_timeout_ms);
        Some(member.expires_at)
    }

    /// The members whose sessions ended by `at`, in name order.
    pub fn expired(&self, at: Millis) -> Vec<Arc<str>> {
        self.members.iter().filter(|(_, member)| member.expires_at <= at).map(|(name, _)| name.clone()).collect()
    }

    /// The earliest session end.
    pub fn earliest_expiry(&self) -> Option<Millis> {
        self.members.values().map(|member| member.expires_at).min()
    }

    /// Computes every member's assignment again (membership changed). An eager strategy revokes everything.
    fn rebalance(&mut self) {
        let names: BTreeSet<Arc<str>> = self.members.keys().cloned().collect();
        let current: Assignment =
            self.members.iter().map(|(name, member)| (name.clone(), member.owned.keys().copied().collect())).collect();
        let assignment = assign(self.strategy, self.n_partitions, &names, &current);
        for (name, partitions) in assignment {
            self.members.get_mut(&name).expect("assigned to a member").assigned = partitions;
        }
        if !self.strategy.is_cooperative() {
            self.revoking_all = true;
        }
        self.n_rebalances += 1;
    }

    /// Grants every free partition to its assignee (for an eager rebalance, only once nothing is owned), and moves the
    /// generation once if anything changed.
    fn settle(&mut self, changes: &mut Changes, changed: bool) {
        if self.revoking_all && self.members.values().all(|member| member.owned.is_empty()) {
            self.revoking_all = false;
        }
        let mut grants = Vec::new();
        if !self.revoking_all {
            let owned: BTreeSet<u32> = self.members.values().flat_map(|member| member.owned.keys().copied()).collect();
            for (name, member) in &self.members {
                for &partition in &member.assigned {
                    if !owned.contains(&partition) {
                        grants.push((name.clone(), partition));
                    }
                }
            }
        }
        if changed || !grants.is_empty() {
            self.generation += 1;
            changes.bumped = true;
        }
        for (name, partition) in grants {
            self.members.get_mut(&name).expect("a member").owned.insert(partition, self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> BTreeSet<Arc<str>> {
        names.iter().map(|name| Arc::from(*name)).collect()
    }

    fn counts(assignment: &Assignment) -> Vec<usize> {
        assignment.values().map(BTreeSet::len).collect()
    }

    #[test]
    fn range_and_round_robin_spread_as_documented() {
        let abc = members(&["a", "b", "c"]);
        let range = assign(Strategy::Range, 7, &abc, &Assignment::new());
        assert_eq!(range["a"], (0..3).collect());
        assert_eq!(range["b"], (3..5).collect());
        assert_eq!(range["c"], (5..7).collect());
        let round = assign(Strategy::RoundRobin, 7, &abc, &Assignment::new());
        assert_eq!(round["a"], [0, 3, 6].into());
        assert_eq!(round["b"], [1, 4].into());
        assert_eq!(counts(&round), vec![3, 2, 2]);
    }

    #[test]
    fn sticky_keeps_what_balance_allows() {
        let current: Assignment =
            [(Arc::from("a"), (0..4).collect()), (Arc::from("b"), (4..8).collect())].into_iter().collect();
        let with_c = assign(Strategy::Sticky, 8, &members(&["a", "b", "c"]), &current);
        assert!(with_c["a"].is_subset(&current["a"]) && with_c["b"].is_subset(&current["b"]));
        assert_eq!(counts(&with_c).iter().sum::<usize>(), 8);
        assert_eq!(with_c["c"].len(), 2);
    }

    #[test]
    fn strategies_parse_by_name() {
        for strategy in Strategy::ALL {
            assert_eq!(strategy.name().parse::<Strategy>(), Ok(strategy));
        }
        assert!("fair".parse::<Strategy>().is_err());
    }
}
