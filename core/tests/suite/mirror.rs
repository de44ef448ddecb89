//! Mirrors: a stream following a stream of another cell at the positions its messages hold there, the source keeping
//! what a mirror lacks, and recalls reaching mirrors through the source's recall log.

use crate::common;

use cellog_core::mirror::{LoggedRecall, MAX_PENDING_RECALLS, MAX_RECALLS_READ, MirrorSource};
use cellog_core::{
    Body, Command, IngestMessage, MAX_INGEST_MESSAGES, Outcome, PublishRequest, Rejection, StreamConfig,
};
use common::{Harness, config};

const PEER: &str = "mirror-west-orders";

fn source_config() -> StreamConfig {
    StreamConfig { partitions: 2, ..config(&["orders.>"]) }
}

fn source() -> MirrorSource {
    MirrorSource { cell: "east".into(), stream: "orders".into(), addresses: vec!["east-1:7400".into()] }
}

/// The source cell with stream `orders` (two partitions) and the mirror registered on it.
fn east() -> Harness {
    let mut h = Harness::new();
    h.create_stream("orders", source_config());
    h.ok(Command::RegisterMirror { stream: "orders".into(), peer: PEER.into() });
    h
}

/// The mirror's cell with `orders` mirroring east's.
fn west() -> Harness {
    let mut h = Harness::new();
    let created = h.ok(Command::CreateMirror { name: "orders".into(), config: source_config(), source: source() });
    assert_eq!(created, Outcome::StreamCreated { created: true });
    h
}

fn publish(h: &mut Harness, partition: u32, id: &str) {
    let request = PublishRequest {
        msg_id: Some(id.into()),
        ..common::keyed("orders.x", &common::key_for(partition, 2), &format!("payload of {id}"))
    };
    h.publish_request(request).expect("a publish on the source");
}

fn last_seqs(h: &Harness, stream: &str) -> Vec<u64> {
    h.cell.stream_info(stream).unwrap().partitions.iter().map(|p| p.high_watermark).collect()
}

/// The messages of `records` (read on `east`) as a mirror's copy carries them: at their positions, ids kept.
fn copies(east: &Harness, records: &[cellog_core::Record]) -> Vec<IngestMessage> {
    records
        .iter()
        .map(|r| IngestMessage {
            partition: r.partition,
            seq: r.seq,
            request: PublishRequest {
                msg_id: r.msg_id.as_deref().map(Into::into),
                key: r.key.clone(),
                headers: r.headers.clone(),
                ..PublishRequest::new(&*r.subject, east.payload(r))
            },
        })
        .collect()
}

/// One round of the mirror's driver: read the source from where the mirror ends, copy, report progress.
fn copy(east: &mut Harness, west: &mut Harness, max: usize) -> Outcome {
    let from: Vec<u64> = last_seqs(west, "orders").iter().map(|seq| seq + 1).collect();
    let applied = west.cell.mirror("orders").expect("a mirror").recalls_applied;
    let read = east.cell.mirror_read("orders", PEER, &from, max, 1 << 20, applied).expect("a mirror's read");
    let messages = copies(east, &read.records);
    let (recalls, recalls_through) = (read.recalls, read.recalls_next);
    let copied = west.ok(Command::MirrorIngest {
        stream: "orders".into(),
        messages,
        through: read.scanned,
        recalls,
        recalls_through,
    });
    let recalls_applied = west.cell.mirror("orders").unwrap().recalls_applied;
    let received = last_seqs(west, "orders");
    east.ok(Command::MirrorProgress { stream: "orders".into(), peer: PEER.into(), received, recalls_applied });
    copied
}

/// What a position holds, as a mirror compares it: the id and payload of a message, or nothing.
fn at(h: &Harness, partition: u32, seq: u64) -> Option<(Option<String>, String)> {
    let record = h.cell.read_from("orders", partition, seq, 1).unwrap().into_iter().find(|r| r.seq == seq)?;
    matches!(record.body, Body::Stored(_))
        .then(|| (record.msg_id.as_deref().map(str::to_string), String::from_utf8_lossy(&h.payload(&record)).into()))
}

/// The mirror is a prefix of the source: through its last sequence, every position holds what the source's does.
fn assert_prefix(east: &Harness, west: &Harness) {
    for (partition, &last) in last_seqs(west, "orders").iter().enumerate() {
        for seq in 1..=last {
            assert_eq!(at(west, partition as u32, seq), at(east, partition as u32, seq), "{partition}/{seq}");
        }
    }
}

#[test]
fn a_mirror_copies_its_source_at_origin_positions_with_ids_in_reads_of_any_size() {
    let (mut east, mut west) = (east(), west());
    for n in 0..10 {
        publish(&mut east, n % 2, &format!("m-{n}"));
    }
    east.ok(Command::Recall { stream: "orders".into(), partition: 1, seq: 2 });
    let mut rounds = 0;
    while last_seqs(&west, "orders") != last_seqs(&east, "orders") {
        copy(&mut east, &mut west, 3);
        assert_prefix(&east, &west);
        rounds += 1;
    }
    assert_eq!(rounds, 5, "a read of three shared between two partitions takes one from each");
    assert_eq!(at(&west, 1, 2), None, "a message recalled before it was read is a hole");
    assert_eq!(at(&west, 0, 5), Some((Some("m-8".into()), "payload of m-8".into())));
    // A copy retried after a lost answer changes nothing.
    let before = common::state_parts(&west.cell);
    let read = east.cell.mirror_read("orders", PEER, &[1, 1], 100, 1 << 20, 0).unwrap();
    assert_eq!(read.scanned, vec![5, 5]);
    let messages = copies(&east, &read.records);
    let again = Command::MirrorIngest {
        stream: "orders".into(),
        messages,
        through: vec![5, 5],
        recalls: vec![],
        recalls_through: 0,
    };
    assert_eq!(west.ok(again), Outcome::Ingested { appended: 0, last_seqs: vec![5, 5] });
    assert_eq!(common::state_parts(&west.cell), before);
    // Ids keep deduplicating: the mirror's stream knows them.
    let info = west.cell.stream_info("orders").unwrap();
    assert_eq!(info.n_dedup_ids, 9);
}

#[test]
fn a_mirror_takes_no_writes_of_its_own() {
    let mut west = west();
    let mirror = Rejection::Mirror { stream: "orders".into(), cell: "east".into(), source_stream: "orders".into() };
    assert_eq!(west.publish("orders.x", "a write").map(|_| ()), Err(mirror.clone()));
    let recall = Command::Recall { stream: "orders".into(), partition: 0, seq: 1 };
    assert_eq!(west.apply(recall).map(|_| ()), Err(mirror));
    // The same mirror again changes nothing but its source's addresses; another source is a conflict.
    let moved = MirrorSource { addresses: vec!["east-9:7400".into()], ..source() };
    let again = Command::CreateMirror { name: "orders".into(), config: source_config(), source: moved };
    assert_eq!(west.ok(again), Outcome::StreamCreated { created: false });
    assert_eq!(west.cell.mirror("orders").unwrap().source.addresses, vec!["east-9:7400".to_string()]);
    let other = MirrorSource { stream: "payments".into(), ..source() };
    let conflict = Command::CreateMirror { name: "orders".into(), config: source_config(), source: other };
    assert_eq!(west.apply(conflict), Err(Rejection::Conflict { what: "mirror".into(), name: "orders".into() }));
    // A mirror's copy goes to a mirror only; a stream of this cell is no mirror.
    west.create_stream("local", config(&["local.>"]));
    let copy = Command::MirrorIngest {
        stream: "local".into(),
        messages: vec![],
        through: vec![],
        recalls: vec![],
        recalls_through: 0,
    };
    assert_eq!(
        west.apply(copy),
        Err(Rejection::Invalid {
            reason: "stream \"local\" is not a mirror; a mirror's copy goes only to a mirror".into()
        })
    );
    // ... and a stream that does not exist is none either.
    let copy = Command::MirrorIngest {
        stream: "nowhere".into(),
        messages: vec![],
        through: vec![],
        recalls: vec![],
        recalls_through: 0,
    };
    assert_eq!(west.apply(copy), Err(Rejection::StreamNotFound { stream: "nowhere".into() }));
    let exists = Command::CreateMirror { name: "local".into(), config: config(&["local.>"]), source: source() };
    assert_eq!(west.apply(exists), Err(Rejection::Conflict { what: "stream".into(), name: "local".into() }));
    // Deleted, the mirror is forgotten: a stream of that name takes writes again.
    west.ok(Command::DeleteStream { name: "orders".into() });
    assert!(west.cell.mirror("orders").is_none());
    west.create_stream("orders", source_config());
    west.publish("orders.x", "a write").expect("no longer a mirror");
}

#[test]
fn a_recall_on_the_source_reaches_a_mirror_that_copied_the_message() {
    let (mut east, mut west) = (east(), west());
    for n in 0..4 {
        publish(&mut east, 0, &format!("m-{n}"));
    }
    copy(&mut east, &mut west, 100);
    assert!(at(&west, 0, 2).is_some());
    east.ok(Command::Recall { stream: "orders".into(), partition: 0, seq: 2 });
    assert_eq!(east.cell.recall_log("orders").unwrap().pending.len(), 1, "kept until the mirror applies it");
    copy(&mut east, &mut west, 100);
    assert_eq!(at(&west, 0, 2), None, "recalled on the mirror too");
    assert_eq!(west.cell.mirror("orders").unwrap().recalls_applied, 1);
    assert!(east.cell.recall_log("orders").unwrap().pending.is_empty(), "applied, and forgotten by the source");
    assert_prefix(&east, &west);
    // A stream nobody mirrors logs no recall.
    east.create_stream("plain", config(&["plain.>"]));
    east.publish("plain.x", "one").unwrap();
    east.ok(Command::Recall { stream: "plain".into(), partition: 0, seq: 1 });
    assert!(east.cell.recall_log("plain").is_none());
    // Unregistered, the mirror no longer holds recalls or retention back.
    east.ok(Command::Recall { stream: "orders".into(), partition: 0, seq: 3 });
    east.ok(Command::UnregisterPeer { stream: "orders".into(), peer: PEER.into() });
    assert!(east.cell.recall_log("orders").is_none());
}

#[test]
fn the_source_keeps_what_its_mirror_has_not_received() {
    let mut east = Harness::new();
    east.create_stream("orders", StreamConfig { max_messages: Some(2), ..source_config() });
    east.ok(Command::RegisterMirror { stream: "orders".into(), peer: PEER.into() });
    let mut west = west();
    publish(&mut east, 0, "m-0");
    publish(&mut east, 0, "m-1");
    let request =
        PublishRequest { msg_id: Some("m-2".into()), ..common::keyed("orders.x", &common::key_for(0, 2), "m-2") };
    assert_eq!(
        east.publish_request(request.clone()),
        Err(Rejection::StorageFull { lagging_peer: PEER.into(), partition: 0, received: 0 })
    );
    copy(&mut east, &mut west, 100);
    east.publish_request(request).expect("the mirror has received the oldest");
    assert_eq!(at(&east, 0, 1), None, "removed once the mirror had it");
    assert!(at(&west, 0, 1).is_some());
}

#[test]
fn recalls_wait_in_a_bounded_log_for_a_lagging_mirror() {
    let mut east = east();
    for n in 0..=MAX_PENDING_RECALLS as u64 {
        east.ok(Command::Publish(common::keyed("orders.x", &common::key_for(0, 2), &n.to_string())));
    }
    for seq in 1..=MAX_PENDING_RECALLS as u64 {
        east.ok(Command::Recall { stream: "orders".into(), partition: 0, seq });
    }
    let before = common::state_parts(&east.cell);
    let last = MAX_PENDING_RECALLS as u64 + 1;
    assert_eq!(
        east.apply(Command::Recall { stream: "orders".into(), partition: 0, seq: last }),
        Err(Rejection::RecallsPending {
            stream: "orders".into(),
            peer: PEER.into(),
            pending: MAX_PENDING_RECALLS as u64
        })
    );
    assert_eq!(common::state_parts(&east.cell), before, "nothing recalled");
    // A mirror reads the log in pages, each going on right after the last: nothing twice, nothing passed over.
    let first = east.cell.mirror_read("orders", PEER, &[1, 1], 1, 1 << 20, 0).unwrap();
    assert_eq!(first.recalls.len(), MAX_RECALLS_READ);
    let second = east.cell.mirror_read("orders", PEER, &[1, 1], 1, 1 << 20, first.recalls_next).unwrap();
    let (end, next) = (first.recalls.last().unwrap().number, second.recalls.first().unwrap().number);
    assert_eq!((first.recalls_next, next), (end + 1, end + 1));
    let received = vec![last, 0];
    east.ok(Command::MirrorProgress { stream: "orders".into(), peer: PEER.into(), received, recalls_applied: 10 });
    east.ok(Command::Recall { stream: "orders".into(), partition: 0, seq: last });
}

#[test]
fn a_mirror_s_reads_and_reports_are_checked() {
    let mut east = east();
    publish(&mut east, 0, "m-0");
    let unknown = Rejection::PeerNotFound { stream: "orders".into(), peer: "stranger".into() };
    assert_eq!(east.cell.mirror_read("orders", "stranger", &[1, 1], 10, 1 << 20, 0), Err(unknown.clone()));
    assert_eq!(
        east.cell.mirror_read("orders", PEER, &[1], 10, 1 << 20, 0),
        Err(Rejection::Invalid { reason: "stream \"orders\" has 2 partitions; the mirror reads 1".into() })
    );
    let cases: Vec<(Command, Rejection)> = vec![
        (
            Command::MirrorProgress {
                stream: "orders".into(),
                peer: "stranger".into(),
                received: vec![0, 0],
                recalls_applied: 0,
            },
            unknown,
        ),
        (
            Command::MirrorProgress {
                stream: "orders".into(),
                peer: PEER.into(),
                received: vec![2, 0],
                recalls_applied: 0,
            },
            Rejection::Invalid { reason: "peer cannot have received sequence 2; partition 0 ends at 1".into() },
        ),
        (
            Command::MirrorProgress {
                stream: "orders".into(),
                peer: PEER.into(),
                received: vec![1],
                recalls_applied: 0,
            },
            Rejection::Invalid {
                reason: "a mirror's progress names every partition: 1 are given, stream \"orders\" has 2".into(),
            },
        ),
        (
            Command::MirrorProgress {
                stream: "orders".into(),
                peer: PEER.into(),
                received: vec![1, 0],
                recalls_applied: 1,
            },
            Rejection::Invalid { reason: "a mirror cannot have applied 1 recalls; stream \"orders\" logged 0".into() },
        ),
    ];
    for (command, refusal) in cases {
        let before = common::state_parts(&east.cell);
        assert_eq!(east.apply(command.clone()), Err(refusal), "{command:?}");
        assert_eq!(common::state_parts(&east.cell), before, "{command:?} changed nothing");
    }
    let mut west = west();
    let recall = |number, partition| cellog_core::mirror::LoggedRecall { number, partition, seq: 1 };
    let bad: Vec<(Vec<cellog_core::mirror::LoggedRecall>, u64)> =
        vec![(vec![recall(0, 2)], 1), (vec![recall(1, 0), recall(0, 0)], 2), (vec![recall(3, 0)], 3)];
    for (recalls, recalls_through) in bad {
        let copy = Command::MirrorIngest {
            stream: "orders".into(),
            messages: vec![],
            through: vec![],
            recalls,
            recalls_through,
        };
        assert!(matches!(west.apply(copy), Err(Rejection::Invalid { .. })));
    }
    assert_eq!(west.cell.mirror("orders").unwrap().recalls_applied, 0);
}

/// A copy carries at most [`MAX_INGEST_MESSAGES`] messages and a source's full page of recalls ([`MAX_RECALLS_READ`]):
/// each bound itself is taken, one past it is refused before anything changes.
#[test]
fn a_mirror_s_copy_is_bounded_in_messages_and_recalls_each_bound_included() {
    let messages = |n: usize| -> Vec<IngestMessage> {
        (1..=n as u64)
            .map(|seq| IngestMessage { partition: 0, seq, request: PublishRequest::new("orders.x", "m") })
            .collect()
    };
    let recalls = |n: usize| -> Vec<LoggedRecall> {
        (0..n as u64).map(|number| LoggedRecall { number, partition: 0, seq: 1 }).collect()
    };
    // (messages, recalls, taken)
    let cases = [
        (MAX_INGEST_MESSAGES, 0, true),
        (MAX_INGEST_MESSAGES + 1, 0, false),
        (1, MAX_RECALLS_READ, true),
        (1, MAX_RECALLS_READ + 1, false),
    ];
    for (n_messages, n_recalls, taken) in cases {
        let mut west = west();
        let before = common::state_parts(&west.cell);
        let copy = Command::MirrorIngest {
            stream: "orders".into(),
            messages: messages(n_messages),
            through: vec![n_messages as u64, 0],
            recalls: recalls(n_recalls),
            recalls_through: n_recalls as u64,
        };
        let result = west.apply(copy);
        let case = format!("{n_messages} messages, {n_recalls} recalls");
        if taken {
            assert!(result.is_ok(), "{case}: {result:?}");
            assert_eq!(last_seqs(&west, "orders"), vec![n_messages as u64, 0], "{case}");
            assert_eq!(west.cell.mirror("orders").unwrap().recalls_applied, n_recalls as u64, "{case}");
        } else {
            assert!(matches!(result, Err(Rejection::Invalid { .. })), "{case}: {result:?}");
            assert_eq!(common::state_parts(&west.cell), before, "{case} changed nothing");
        }
    }
}

#[test]
fn a_mirror_s_read_stays_within_its_byte_budget_and_always_makes_progress() {
    let mut east = east();
    for n in 0..4 {
        publish(&mut east, 0, &format!("m-{n}"));
    }
    let all = east.cell.mirror_read("orders", PEER, &[1, 1], 100, 1 << 20, 0).unwrap().records;
    assert_eq!(all.len(), 4);
    let two = all[0].size() + all[1].size();
    // Per budget: how many records come back, and through which sequence partition 0 was read.
    for (budget, taken) in [(two, 2), (two - 1, 1), (1, 1), (1 << 20, 4)] {
        let read = east.cell.mirror_read("orders", PEER, &[1, 1], 100, budget, 0).unwrap();
        assert_eq!(read.records.len(), taken, "a budget of {budget} bytes");
        assert_eq!(read.scanned[0], taken as u64, "a budget of {budget} bytes");
    }
}
