//! Consumer groups: the four strategies as pure functions (properties over random memberships), and the protocol in
//! the cell (join, heartbeat and release, leave, expiry, member fetch, fenced acks and commits, snapshots), with a
//! property test that no partition ever has two owners and that ownership moves only through a release.

use crate::common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cellog_core::group::{Assignment, assign};
use cellog_core::{
    AckAnswer, AckItem, AckKind, AckState, Cap, Cell, Command, ConsumerConfig, Delivery, GroupChange, GroupMember,
    MemberAssignment, Outcome, Rejection, Strategy, StreamConfig, Transition,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;

// ----- the strategies as functions -----

fn names(members: &[u8]) -> BTreeSet<Arc<str>> {
    members.iter().map(|m| Arc::from(format!("m{m}"))).collect()
}

/// How many partitions leave a member that is still in the group, from `before` to `after`.
fn moved(before: &Assignment, after: &Assignment) -> usize {
    after
        .iter()
        .map(|(member, partitions)| {
            before.get(member).map_or(0, |had| had.iter().filter(|p| !partitions.contains(p)).count())
        })
        .sum()
}

/// The fewest partitions any balanced assignment must take from the members that stay: each keeps at most its
/// quota, and the larger quotas best go to those that own the most.
fn fewest_moves(n_partitions: u32, members: &BTreeSet<Arc<str>>, current: &Assignment) -> usize {
    let n = members.len() as u32;
    let (base, extra) = (n_partitions / n, n_partitions % n);
    let mut owned: Vec<usize> = members.iter().map(|m| current.get(m).map_or(0, BTreeSet::len)).collect();
    owned.sort_unstable_by(|a, b| b.cmp(a));
    owned
        .iter()
        .enumerate()
        .map(|(rank, &had)| had.saturating_sub((base + u32::from((rank as u32) < extra)) as usize))
        .sum()
}

fn check_whole_and_balanced(n_partitions: u32, members: &BTreeSet<Arc<str>>, assignment: &Assignment) {
    assert_eq!(assignment.keys().cloned().collect::<BTreeSet<_>>(), *members, "one entry per member");
    let mut seen = BTreeSet::new();
    for partitions in assignment.values() {
        for &p in partitions {
            assert!(p < n_partitions, "partition {p} does not exist");
            assert!(seen.insert(p), "partition {p} assigned twice");
        }
    }
    if !members.is_empty() {
        assert_eq!(seen.len() as u32, n_partitions, "every partition assigned");
        let counts: Vec<usize> = assignment.values().map(BTreeSet::len).collect();
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(max - min <= 1, "balanced within one partition: {counts:?}");
    }
}

proptest! {
    /// Over a run of random membership changes, every strategy assigns every partition once and keeps the members
    /// within one partition of each other; the sticky strategies move exactly the fewest partitions balance requires,
    /// never more than range or round-robin would.
    #[test]
    fn strategies_balance_and_sticky_moves_the_fewest(
        n_partitions in 1u32..70,
        steps in proptest::collection::vec(proptest::collection::btree_set(0u8..12, 0..10), 1..12),
    ) {
        for strategy in Strategy::ALL {
            let mut current = Assignment::new();
            for step in &steps {
                let members = names(&step.iter().copied().collect::<Vec<_>>());
                let live: Assignment =
                    current.iter().filter(|(m, _)| members.contains(*m)).map(|(m, p)| (m.clone(), p.clone())).collect();
                let next = assign(strategy, n_partitions, &members, &live);
                check_whole_and_balanced(n_partitions, &members, &next);
                prop_assert_eq!(&next, &assign(strategy, n_partitions, &members, &live), "pure: the same again");
                if matches!(strategy, Strategy::Sticky | Strategy::CooperativeSticky) && !members.is_empty() {
                    let fewest = fewest_moves(n_partitions, &members, &live);
                    prop_assert_eq!(moved(&live, &next), fewest, "sticky moves the fewest");
                    for eager in [Strategy::Range, Strategy::RoundRobin] {
                        prop_assert!(moved(&live, &assign(eager, n_partitions, &members, &live)) >= fewest);
                    }
                }
                current = next;
            }
        }
    }
}

// ----- the protocol in the cell -----

const SESSION: u64 = 3_000;

fn stream_of(partitions: u32) -> Harness {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions, ..StreamConfig::with_subjects(["orders.>"]) });
    h
}

fn join(h: &mut Harness, member: &str, strategy: Strategy) -> Result<MemberAssignment, Rejection> {
    h.apply(Command::JoinGroup {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        strategy,
        session_timeout_ms: SESSION,
        config: ConsumerConfig::default(),
    })
    .map(assignment)
}

fn assignment(outcome: Outcome) -> MemberAssignment {
    match outcome {
        Outcome::GroupAssignment(assignment) => assignment,
        other => panic!("expected an assignment, got {other:?}"),
    }
}

fn heartbeat(h: &mut Harness, member: &str, generation: u64, released: &[u32]) -> Result<MemberAssignment, Rejection> {
    h.apply(Command::Heartbeat {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        generation,
        released: released.to_vec(),
    })
    .map(assignment)
}

/// Two heartbeats at the group's generation, the second releasing whatever the first said to revoke, as a
/// well-behaved member does.
fn try_settle(h: &mut Harness, member: &str) -> Result<MemberAssignment, Rejection> {
    let current = generation_of(h);
    let now = heartbeat(h, member, current, &[])?;
    heartbeat(h, member, now.generation, &now.revoking)
}

fn settle(h: &mut Harness, member: &str) -> MemberAssignment {
    try_settle(h, member).unwrap()
}

fn member_fetch(h: &mut Harness, member: &str, generation: u64, max: u32) -> Result<(u64, Vec<Delivery>), Rejection> {
    match h.apply(Command::MemberFetch {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        generation,
        max,
    })? {
        Outcome::MemberFetched { generation, deliveries } => Ok((generation, deliveries)),
        other => panic!("expected a member fetch, got {other:?}"),
    }
}

fn member_ack(h: &mut Harness, member: &str, generation: u64, partition: u32, seq: u64) -> Result<Outcome, Rejection> {
    h.apply(Command::MemberAck {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        generation,
        partition,
        seq,
        kind: AckKind::Applied,
    })
}

fn generation_of(h: &Harness) -> u64 {
    h.cell.group_info("orders", "g", h.now).unwrap().generation
}

fn owners(h: &Harness) -> BTreeMap<u32, Option<Arc<str>>> {
    h.cell.group_info("orders", "g", h.now).unwrap().partitions.into_iter().map(|p| (p.partition, p.owner)).collect()
}

/// Publishes one message to each partition of `n`, keyed to land there.
fn one_per_partition(h: &mut Harness, n: u32) {
    for p in 0..n {
        h.publish_request(keyed("orders.x", &key_for(p, n), &format!("p{p}"))).unwrap();
    }
}

#[test]
fn the_first_join_creates_the_group_and_its_consumer_and_owns_everything() {
    for strategy in Strategy::ALL {
        let mut h = stream_of(4);
        let a = join(&mut h, "a", strategy).unwrap();
        assert_eq!(
            (a.generation, a.partitions.clone(), a.revoking.len(), a.pending.len()),
            (1, vec![0, 1, 2, 3], 0, 0)
        );
        assert!(h.cell.consumer_info("orders", "g", h.now).is_ok(), "the group consumes through its consumer");
        assert_eq!(h.cell.group_names("orders").unwrap(), vec![Arc::from("g")]);
        let changed: Vec<_> =
            h.take_effects().into_iter().filter(|e| matches!(e, Transition::GroupChanged { .. })).collect();
        let everything: Vec<(Arc<str>, u32)> = (0..4).map(|p| (Arc::from("a"), p)).collect();
        assert!(
            matches!(&changed[..], [Transition::GroupChanged { change: GroupChange::Joined, generation: 1, granted, revoking, .. }]
                if *granted == everything && revoking.is_empty()),
            "{changed:?}"
        );
    }
}

#[test]
fn an_eager_join_revokes_everything_first_and_assigns_once_all_is_released() {
    let mut h = stream_of(4);
    join(&mut h, "a", Strategy::Range).unwrap();
    let b = join(&mut h, "b", Strategy::Range).unwrap();
    assert_eq!(b.generation, 2);
    assert!(b.partitions.is_empty() && b.pending == vec![2, 3], "b waits: {b:?}");
    let a = heartbeat(&mut h, "a", 2, &[]).unwrap();
    assert_eq!((a.partitions.len(), a.revoking.clone()), (0, vec![0, 1, 2, 3]), "a keeps nothing fetchable");
    let (_, nothing) = member_fetch(&mut h, "a", 2, 10).unwrap();
    assert!(nothing.is_empty());
    let a = heartbeat(&mut h, "a", 2, &[0, 1, 2, 3]).unwrap();
    assert_eq!((a.generation, a.partitions), (3, vec![0, 1]), "range gives a the first half once all is released");
    let b = heartbeat(&mut h, "b", 3, &[]).unwrap();
    assert_eq!(b.partitions, vec![2, 3]);
}

#[test]
fn a_cooperative_join_revokes_only_what_moves_and_the_rest_keeps_flowing() {
    let mut h = stream_of(4);
    join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    settle(&mut h, "a");
    settle(&mut h, "b");
    let before = owners(&h);
    let c = join(&mut h, "c", Strategy::CooperativeSticky).unwrap();
    assert!(c.partitions.is_empty() && c.pending.len() == 1, "c waits for one partition: {c:?}");
    let a = heartbeat(&mut h, "a", c.generation, &[]).unwrap();
    let b = heartbeat(&mut h, "b", c.generation, &[]).unwrap();
    assert_eq!(a.revoking.len() + b.revoking.len(), 1, "exactly one partition moves");
    assert_eq!(a.partitions.len() + b.partitions.len(), 3, "the other three stay fetchable throughout");
    one_per_partition(&mut h, 4);
    let (_, got) = member_fetch(&mut h, "a", a.generation, 10).unwrap();
    assert_eq!(got.iter().map(|d| d.record.partition).collect::<Vec<_>>(), a.partitions, "a fetches its own");
    let (giver, revoking) = if a.revoking.is_empty() { ("b", b.revoking) } else { ("a", a.revoking) };
    heartbeat(&mut h, giver, c.generation, &revoking).unwrap();
    let current = generation_of(&h);
    let c = heartbeat(&mut h, "c", current, &[]).unwrap();
    assert_eq!(c.partitions, revoking, "c gets the released partition in the next generation");
    let after = owners(&h);
    let changed = (0..4).filter(|p| before[p] != after[p]).count();
    assert_eq!(changed, 1);
}

#[test]
fn a_stale_generation_or_a_moved_partition_is_refused_and_changes_nothing() {
    let mut h = stream_of(2);
    let a = join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    one_per_partition(&mut h, 2);
    let (_, got) = member_fetch(&mut h, "a", a.generation, 10).unwrap();
    assert_eq!(got.len(), 2);
    let b = join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    let a2 = heartbeat(&mut h, "a", b.generation, &[]).unwrap();
    let moving = a2.revoking[0];
    // Revoking, a may still ack what it holds of the moving partition.
    let moving_seq = got.iter().find(|d| d.record.partition == moving).unwrap().record.seq;
    heartbeat(&mut h, "a", a2.generation, &[moving]).unwrap();
    // Everything but the cell's own counters (commands applied, time).
    let state = |h: &Harness| state_parts(&h.cell).into_iter().filter(|(part, _)| part != "cell").collect::<Vec<_>>();
    let digest = state(&h);
    let refused = member_ack(&mut h, "a", a2.generation, moving, moving_seq).unwrap_err();
    let current = generation_of(&h);
    assert_eq!(
        refused,
        Rejection::NotOwner { group: "g".into(), member: "a".into(), partition: moving, generation: current }
    );
    let commit = h.apply(Command::MemberCommit {
        stream: "orders".into(),
        group: "g".into(),
        member: "a".into(),
        generation: a2.generation,
        partition: moving,
        next_seq: moving_seq + 1,
    });
    assert!(matches!(commit, Err(Rejection::NotOwner { .. })));
    assert_eq!(state(&h), digest, "a refused ack or commit changes nothing");
    // The new owner gets the released delivery again, and its ack at its generation lands.
    let b = heartbeat(&mut h, "b", current, &[]).unwrap();
    assert_eq!(b.partitions, vec![moving]);
    let (_, again) = member_fetch(&mut h, "b", b.generation, 10).unwrap();
    assert_eq!(
        again.iter().map(|d| (d.record.partition, d.record.seq, d.delivery_count)).collect::<Vec<_>>(),
        vec![(moving, moving_seq, 2)]
    );
    assert!(member_ack(&mut h, "b", b.generation, moving, moving_seq).is_ok());
    // An older generation than the grant is refused even to the owner; an unknown member is told to join.
    assert!(matches!(member_ack(&mut h, "b", b.generation - 1, moving, moving_seq), Err(Rejection::NotOwner { .. })));
    assert!(matches!(member_ack(&mut h, "z", 1, moving, moving_seq), Err(Rejection::UnknownMember { .. })));
}

/// A member's batch of acks is answered item by item: what it owns in its generation is acked, a partition that moved
/// away is refused alone; the same batch without a member is refused whole, as a plain ack on a group's consumer is.
#[test]
fn a_member_s_batch_of_acks_is_answered_item_by_item() {
    let mut h = stream_of(2);
    let a = join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    one_per_partition(&mut h, 2);
    let (_, got) = member_fetch(&mut h, "a", a.generation, 10).unwrap();
    let b = join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    let a2 = heartbeat(&mut h, "a", b.generation, &[]).unwrap();
    let moving = a2.revoking[0];
    heartbeat(&mut h, "a", a2.generation, &[moving]).unwrap();
    let items: Vec<AckItem> = got
        .iter()
        .map(|d| AckItem { partition: d.record.partition, seq: d.record.seq, kind: AckKind::Applied })
        .collect();
    let plain = Command::Acks { stream: "orders".into(), consumer: "g".into(), member: None, items: items.clone() };
    assert!(matches!(h.apply(plain), Err(Rejection::Invalid { .. })));
    let current = generation_of(&h);
    let member = Some(GroupMember { member: "a".into(), generation: a2.generation });
    let acks = Command::Acks { stream: "orders".into(), consumer: "g".into(), member, items: items.clone() };
    let Ok(Outcome::AckedEach(answers)) = h.apply(acks) else { panic!("one answer per ack") };
    for (item, answer) in items.iter().zip(&answers) {
        if item.partition == moving {
            let owner_moved =
                Rejection::NotOwner { group: "g".into(), member: "a".into(), partition: moving, generation: current };
            assert_eq!(answer, &Err(owner_moved));
        } else {
            assert_eq!(answer, &Ok(AckAnswer { state: AckState::Applied, already_done: false }));
        }
    }
    assert_eq!(answers.len(), 2);
}

#[test]
fn plain_fetch_ack_and_commit_on_a_groups_consumer_are_refused() {
    let mut h = stream_of(1);
    join(&mut h, "a", Strategy::Range).unwrap();
    h.publish("orders.x", "m").unwrap();
    for command in [
        Command::Fetch { stream: "orders".into(), consumer: "g".into(), member: "x".into(), max: 1 },
        Command::Ack { stream: "orders".into(), consumer: "g".into(), partition: 0, seq: 1, kind: AckKind::Applied },
        Command::CommitCursor { stream: "orders".into(), consumer: "g".into(), partition: 0, next_seq: 2 },
    ] {
        assert!(matches!(h.apply(command), Err(Rejection::Invalid { .. })));
    }
}

#[test]
fn a_member_that_misses_its_session_is_removed_and_its_partitions_move() {
    let mut h = stream_of(2);
    join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    settle(&mut h, "a");
    settle(&mut h, "b");
    one_per_partition(&mut h, 2);
    let current = generation_of(&h);
    let b = heartbeat(&mut h, "b", current, &[]).unwrap();
    let (_, held) = member_fetch(&mut h, "b", b.generation, 10).unwrap();
    assert_eq!(held.len(), 1);
    let deadline = h.cell.next_deadline().unwrap();
    for _ in 0..5 {
        h.advance(SESSION / 2);
        settle(&mut h, "a");
    }
    assert!(deadline <= h.now);
    assert!(matches!(heartbeat(&mut h, "b", b.generation, &[]), Err(Rejection::UnknownMember { .. })));
    let expired = h
        .take_effects()
        .into_iter()
        .any(|e| matches!(e, Transition::GroupChanged { change: GroupChange::Expired, .. }));
    assert!(expired);
    let a = settle(&mut h, "a");
    assert_eq!(a.partitions, vec![0, 1]);
    let (_, redelivered) = member_fetch(&mut h, "a", a.generation, 10).unwrap();
    assert!(redelivered.iter().any(|d| d.record.seq == held[0].record.seq
        && d.record.partition == held[0].record.partition
        && d.delivery_count == 2));
}

#[test]
fn leaving_hands_partitions_over_and_a_second_leave_says_so() {
    let mut h = stream_of(3);
    join(&mut h, "a", Strategy::RoundRobin).unwrap();
    join(&mut h, "b", Strategy::RoundRobin).unwrap();
    settle(&mut h, "a");
    settle(&mut h, "b");
    let leave = || Command::LeaveGroup { stream: "orders".into(), group: "g".into(), member: "b".into() };
    assert_eq!(h.ok(leave()), Outcome::GroupLeft { was_member: true });
    assert_eq!(h.ok(leave()), Outcome::GroupLeft { was_member: false });
    let a = settle(&mut h, "a");
    assert_eq!(a.partitions, vec![0, 1, 2]);
}

#[test]
fn joining_again_fences_the_earlier_incarnation() {
    let mut h = stream_of(1);
    let first = join(&mut h, "a", Strategy::Sticky).unwrap();
    h.publish("orders.x", "m").unwrap();
    let (_, got) = member_fetch(&mut h, "a", first.generation, 1).unwrap();
    let second = join(&mut h, "a", Strategy::Sticky).unwrap();
    assert!(second.generation > first.generation && second.partitions == vec![0]);
    assert!(matches!(member_ack(&mut h, "a", first.generation, 0, got[0].record.seq), Err(Rejection::NotOwner { .. })));
    let (_, again) = member_fetch(&mut h, "a", second.generation, 1).unwrap();
    assert_eq!(again[0].delivery_count, 2);
    assert!(member_ack(&mut h, "a", second.generation, 0, again[0].record.seq).is_ok());
}

#[test]
fn bad_joins_are_refused_with_what_is_wrong() {
    let mut h = stream_of(2);
    join(&mut h, "a", Strategy::Range).unwrap();
    assert!(matches!(join(&mut h, "b", Strategy::Sticky), Err(Rejection::InvalidConfig { .. })));
    let other_config = h.apply(Command::JoinGroup {
        stream: "orders".into(),
        group: "g".into(),
        member: "b".into(),
        strategy: Strategy::Range,
        session_timeout_ms: SESSION,
        config: ConsumerConfig { max_deliver: Some(3), ..ConsumerConfig::default() },
    });
    assert!(matches!(other_config, Err(Rejection::Conflict { .. })));
    h.create_consumer("orders", "plain", ConsumerConfig::default());
    let on_plain = h.apply(Command::JoinGroup {
        stream: "orders".into(),
        group: "plain".into(),
        member: "a".into(),
        strategy: Strategy::Range,
        session_timeout_ms: SESSION,
        config: ConsumerConfig::default(),
    });
    assert!(matches!(on_plain, Err(Rejection::InvalidConfig { .. })));
    let short = h.apply(Command::JoinGroup {
        stream: "orders".into(),
        group: "g".into(),
        member: "c".into(),
        strategy: Strategy::Range,
        session_timeout_ms: 1,
        config: ConsumerConfig::default(),
    });
    assert!(matches!(short, Err(Rejection::Invalid { .. })));
    assert!(matches!(heartbeat(&mut h, "a", 99, &[]), Err(Rejection::Invalid { .. })), "a generation ahead");
    assert!(matches!(heartbeat(&mut h, "a", 1, &[7]), Err(Rejection::Invalid { .. })), "no partition 7");
    let missing = h.apply(Command::Heartbeat {
        stream: "orders".into(),
        group: "nope".into(),
        member: "a".into(),
        generation: 0,
        released: vec![],
    });
    assert!(matches!(missing, Err(Rejection::GroupNotFound { .. })));
    let _ = Cap::GroupMembers;
}

#[test]
fn deleting_the_consumer_or_the_stream_deletes_the_group() {
    let mut h = stream_of(1);
    join(&mut h, "a", Strategy::Range).unwrap();
    h.ok(Command::DeleteConsumer { stream: "orders".into(), name: "g".into() });
    assert!(matches!(heartbeat(&mut h, "a", 1, &[]), Err(Rejection::GroupNotFound { .. })));
    join(&mut h, "a", Strategy::Range).unwrap();
    h.ok(Command::DeleteStream { name: "orders".into() });
    h.create_stream("orders", StreamConfig::with_subjects(["orders.>"]));
    assert!(matches!(heartbeat(&mut h, "a", 1, &[]), Err(Rejection::GroupNotFound { .. })));
}

#[test]
fn groups_survive_a_snapshot_and_their_sessions_still_end() {
    let mut h = stream_of(4);
    join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    one_per_partition(&mut h, 4);
    let current = generation_of(&h);
    let a = heartbeat(&mut h, "a", current, &[]).unwrap();
    member_fetch(&mut h, "a", a.generation, 10).unwrap();
    let bytes = h.cell.snapshot();
    assert_eq!(Cell::reencode_snapshot(&bytes).unwrap(), bytes, "encoded as version 7 says");
    let mut restored = Cell::restore(&bytes).unwrap();
    assert_eq!(restored, h.cell);
    assert_eq!(restored.next_deadline(), h.cell.next_deadline(), "the sessions' end is a deadline again");
    let later = h.now.plus(SESSION * 2);
    restored.trace_transitions(true);
    restored.apply(later, Command::Tick).unwrap();
    restored.drain_work().for_each(drop);
    let changes: Vec<Transition> =
        restored.drain_transitions().filter(|t| matches!(t, Transition::GroupChanged { .. })).collect();
    assert_eq!(changes.len(), 2, "both members expire: {changes:?}");
}

// ----- no partition ever has two owners -----

#[derive(Clone, Debug)]
enum Step {
    Join(u8),
    Leave(u8),
    /// A heartbeat that releases what it is told to revoke (or, with `stale`, what it was told a generation ago).
    Beat {
        member: u8,
        release: bool,
    },
    Wait(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    prop_oneof![
        (0u8..5).prop_map(Step::Join),
        (0u8..5).prop_map(Step::Leave),
        ((0u8..5), any::<bool>()).prop_map(|(member, release)| Step::Beat { member, release }),
        (0u64..2_000).prop_map(Step::Wait),
    ]
}

proptest! {
    /// After every step, for every strategy: no partition has two owners; a partition changes owner only in a step
    /// whose command released it (a release, a leave, an expiry, a new incarnation); the generation never goes back;
    /// and once everyone has released what they were told, the group settles to its balanced assignment.
    #[test]
    fn a_partition_never_has_two_owners_and_moves_only_when_released(
        n_partitions in 1u32..9,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        for strategy in Strategy::ALL {
            let mut h = stream_of(n_partitions);
            let mut last_generation = 0;
            let mut known: BTreeMap<u8, MemberAssignment> = BTreeMap::new();
            for step in &steps {
                let before = if h.cell.group_names("orders").unwrap().is_empty() { None } else { Some(owners(&h)) };
                h.take_effects();
                match step {
                    Step::Join(m) => {
                        let a = join(&mut h, &format!("m{m}"), strategy).unwrap();
                        known.insert(*m, a);
                    }
                    Step::Leave(m) => {
                        if before.is_some() {
                            h.ok(Command::LeaveGroup { stream: "orders".into(), group: "g".into(), member: format!("m{m}") });
                            known.remove(m);
                        }
                    }
                    Step::Beat { member, release } => {
                        if let Some(seen) = known.get(member).cloned() {
                            let released = if *release { seen.revoking.clone() } else { vec![] };
                            match heartbeat(&mut h, &format!("m{member}"), seen.generation, &released) {
                                Ok(a) => { known.insert(*member, a); }
                                Err(Rejection::UnknownMember { .. }) => { known.remove(member); }
                                Err(other) => panic!("heartbeat refused: {other}"),
                            }
                        }
                    }
                    Step::Wait(ms) => { h.advance(*ms); h.tick(); }
                }
                if h.cell.group_names("orders").unwrap().is_empty() {
                    continue;
                }
                let before = before.unwrap_or_default();
                let info = h.cell.group_info("orders", "g", h.now).unwrap();
                prop_assert!(info.generation >= last_generation);
                last_generation = info.generation;
                let mut owned = BTreeSet::new();
                for member in &info.members {
                    for p in member.assignment.partitions.iter().chain(&member.assignment.revoking) {
                        prop_assert!(owned.insert(*p), "partition {} owned twice", p);
                    }
                }
                let released: BTreeSet<u32> = h
                    .effects
                    .iter()
                    .filter_map(|e| match e { Transition::GroupChanged { released, .. } => Some(released.clone()), _ => None })
                    .flatten()
                    .collect();
                let after = owners(&h);
                for p in 0..n_partitions {
                    if let (Some(Some(old)), Some(Some(new))) = (before.get(&p), after.get(&p))
                        && old != new
                    {
                        prop_assert!(released.contains(&p), "partition {} moved {} -> {} without a release", p, old, new);
                    }
                }
            }
            // Everyone left releases what it must; the group then owns the balanced assignment.
            for _ in 0..3 {
                for m in known.keys().copied().collect::<Vec<_>>() {
                    match try_settle(&mut h, &format!("m{m}")) {
                        Ok(a) => { known.insert(m, a); }
                        Err(Rejection::UnknownMember { .. }) => { known.remove(&m); }
                        Err(other) => panic!("heartbeat refused: {other}"),
                    }
                }
            }
            if !known.is_empty() {
                let info = h.cell.group_info("orders", "g", h.now).unwrap();
                prop_assert!(!info.rebalancing, "settled: {:?}", info.partitions);
                prop_assert!(info.partitions.iter().all(|p| p.owner.is_some() && p.owner == p.assignee));
            }
        }
    }
}

#[test]
fn a_members_window_counts_its_own_deliveries_awaiting_an_ack() {
    let mut h = stream_of(2);
    let a = join(&mut h, "a", Strategy::Range).unwrap();
    one_per_partition(&mut h, 2);
    one_per_partition(&mut h, 2);
    let (_, deliveries) = member_fetch(&mut h, "a", a.generation, 3).unwrap();
    assert_eq!(deliveries.len(), 3);
    let pending = |h: &Harness| h.cell.member_work("orders", "g", "a", a.generation).unwrap().1;
    assert_eq!(pending(&h), 3, "every delivery of every partition it owns counts");
    let first = &deliveries[0].record;
    member_ack(&mut h, "a", a.generation, first.partition, first.seq).unwrap();
    assert_eq!(pending(&h), 2, "an ack frees its place");
    let second = &deliveries[1].record;
    h.apply(Command::MemberAck {
        stream: "orders".into(),
        group: "g".into(),
        member: "a".into(),
        generation: a.generation,
        partition: second.partition,
        seq: second.seq,
        kind: AckKind::Nack { delay_ms: 60_000 },
    })
    .unwrap();
    assert_eq!(pending(&h), 1, "a delivery waiting out its nack's delay holds no place, though its member keeps it");
}

#[test]
fn a_change_of_generation_is_announced_and_a_heartbeat_that_changes_nothing_is_not() {
    let mut h = stream_of(2);
    let a = join(&mut h, "a", Strategy::CooperativeSticky).unwrap();
    h.take_effects();
    let again = heartbeat(&mut h, "a", a.generation, &[]).unwrap();
    assert_eq!((again.generation, again.partitions), (a.generation, a.partitions));
    let changed: Vec<_> =
        h.take_effects().into_iter().filter(|e| matches!(e, Transition::GroupChanged { .. })).collect();
    assert!(changed.is_empty(), "{changed:?}");
    // A second member's join moves the generation, and is announced with what it revokes from the first.
    let b = join(&mut h, "b", Strategy::CooperativeSticky).unwrap();
    assert!(b.generation > a.generation);
    let changed: Vec<_> =
        h.take_effects().into_iter().filter(|e| matches!(e, Transition::GroupChanged { .. })).collect();
    assert!(
        matches!(&changed[..], [Transition::GroupChanged { change: GroupChange::Joined, member, revoking, .. }]
            if &**member == "b" && revoking.len() == 1),
        "{changed:?}"
    );
}

/// A member's fetch asks for between 1 and [`cellog_core::MAX_FETCH`] messages, both bounds included.
#[test]
fn a_member_fetch_asks_for_at_most_the_fetch_bound() {
    let fetch = |max| Command::MemberFetch {
        stream: "orders".into(),
        group: "g".into(),
        member: "m".into(),
        generation: 1,
        max,
    };
    assert_eq!(fetch(1).check(), Ok(()));
    assert_eq!(fetch(cellog_core::MAX_FETCH).check(), Ok(()));
    assert!(matches!(fetch(0).check(), Err(Rejection::Invalid { .. })));
    assert!(matches!(fetch(cellog_core::MAX_FETCH + 1).check(), Err(Rejection::Invalid { .. })));
}

/// A batch of acks carries between 1 and [`cellog_core::MAX_FETCH`] items, names its member well, and delays a nack
/// no longer than any nack may be delayed.
#[test]
fn a_batch_of_acks_is_bounded_and_checked() {
    let item = AckItem { partition: 0, seq: 1, kind: AckKind::Applied };
    let acks = |member: Option<&str>, items: Vec<AckItem>| Command::Acks {
        stream: "orders".into(),
        consumer: "g".into(),
        member: member.map(|member| GroupMember { member: member.into(), generation: 1 }),
        items,
    };
    let most = cellog_core::MAX_FETCH as usize;
    assert_eq!(acks(None, vec![item]).check(), Ok(()));
    assert_eq!(acks(Some("m"), vec![item; most]).check(), Ok(()));
    assert!(matches!(acks(None, vec![]).check(), Err(Rejection::Invalid { .. })));
    assert!(matches!(acks(None, vec![item; most + 1]).check(), Err(Rejection::Invalid { .. })));
    assert!(matches!(acks(Some("m m"), vec![item]).check(), Err(Rejection::InvalidName { .. })));
    let long_nack = AckItem { kind: AckKind::Nack { delay_ms: u64::MAX }, ..item };
    assert!(matches!(acks(None, vec![item, long_nack]).check(), Err(Rejection::Invalid { .. })));
    let single =
        Command::Ack { stream: "orders".into(), consumer: "c".into(), partition: 0, seq: 1, kind: long_nack.kind };
    assert_eq!(acks(None, vec![long_nack]).check(), single.check(), "a batch refuses a nack as a lone ack does");
}
