//! Many cells: the directory's records of cells and placements, and the ownership epochs by which the cell a stream
//! moved away from refuses its writes, and the cell it moves to waits until it has caught up.

use crate::common;

use cellog_core::placement::{MAX_ADDRESS_BYTES, MAX_CELL_ADDRESSES, Ownership, Placement};
use cellog_core::{
    AckKind, Command, ConsumerConfig, IngestMessage, MAX_INGEST_MESSAGES, NameKind, Outcome, Rejection, StreamConfig,
};
use common::{Harness, config};

fn put_cell(cell: &str) -> Command {
    Command::PutCell { cell: cell.into(), addresses: vec![format!("{cell}-1:7400"), format!("{cell}-2:7400")] }
}

fn place(stream: &str, cell: &str) -> Command {
    Command::PlaceStream { stream: stream.into(), cell: cell.into() }
}

fn move_to(stream: &str, to: &str, epoch: u64) -> Command {
    Command::MoveStream { stream: stream.into(), to: to.into(), epoch }
}

fn finish(stream: &str, epoch: u64) -> Command {
    Command::FinishMove { stream: stream.into(), epoch }
}

fn fence(stream: &str, epoch: u64, to: &str) -> Command {
    Command::FenceStream { stream: stream.into(), epoch, to: to.into() }
}

fn receive(stream: &str, epoch: u64, from: &str) -> Command {
    Command::ReceiveStream { stream: stream.into(), epoch, from: from.into(), config: None }
}

fn accept(stream: &str, epoch: u64) -> Command {
    Command::AcceptStream { stream: stream.into(), epoch, through: vec![] }
}

fn accept_through(stream: &str, epoch: u64, through: &[u64]) -> Command {
    Command::AcceptStream { stream: stream.into(), epoch, through: through.to_vec() }
}

fn placed(cell: &str, epoch: u64, moving_from: Option<&str>) -> Result<Outcome, Rejection> {
    Ok(Outcome::Placed(Placement { cell: cell.into(), epoch, moving_from: moving_from.map(Into::into) }))
}

fn stale(stream: &str, epoch: u64, current: u64) -> Result<Outcome, Rejection> {
    Err(Rejection::StaleEpoch { stream: stream.into(), epoch, current })
}

fn invalid(reason: &str) -> Result<Outcome, Rejection> {
    Err(Rejection::Invalid { reason: reason.into() })
}

/// A directory that knows cells `a`, `b` and `c`.
fn directory() -> Harness {
    let mut h = Harness::new();
    for cell in ["a", "b", "c"] {
        h.ok(put_cell(cell));
    }
    h
}

/// Each step on a fresh directory of cells `a`, `b` and `c`, in order, with the answer it must get.
#[test]
fn the_directory_places_and_moves_streams_one_epoch_at_a_time() {
    type Step = (Command, Result<Outcome, Rejection>);
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "placing starts at epoch 1, and again on the same cell changes nothing",
            vec![(place("orders", "a"), placed("a", 1, None)), (place("orders", "a"), placed("a", 1, None))],
        ),
        (
            "a stream placed elsewhere is not placed again",
            vec![
                (place("orders", "a"), placed("a", 1, None)),
                (place("orders", "b"), Err(Rejection::Conflict { what: "placement".into(), name: "orders".into() })),
            ],
        ),
        (
            "only a cell the directory knows",
            vec![
                (place("orders", "z"), Err(Rejection::CellNotFound { cell: "z".into() })),
                (place("orders", "a"), placed("a", 1, None)),
                (move_to("orders", "z", 1), Err(Rejection::CellNotFound { cell: "z".into() })),
            ],
        ),
        (
            "a move raises the epoch and remembers where it comes from until it is finished",
            vec![
                (place("orders", "a"), placed("a", 1, None)),
                (move_to("orders", "b", 1), placed("b", 2, Some("a"))),
                (finish("orders", 2), placed("b", 2, None)),
                (move_to("orders", "c", 2), placed("c", 3, Some("b"))),
            ],
        ),
        (
            "a move from an epoch the mover no longer sees is refused; the same move again is answered alike",
            vec![
                (place("orders", "a"), placed("a", 1, None)),
                (move_to("orders", "b", 1), placed("b", 2, Some("a"))),
                (move_to("orders", "b", 1), placed("b", 2, Some("a"))),
                (move_to("orders", "c", 1), stale("orders", 1, 2)),
                (finish("orders", 2), placed("b", 2, None)),
                (move_to("orders", "c", 1), stale("orders", 1, 2)),
                (finish("orders", 1), stale("orders", 1, 2)),
            ],
        ),
        (
            "one move at a time, and never to where it already is",
            vec![
                (place("orders", "a"), placed("a", 1, None)),
                (move_to("orders", "a", 1), invalid("stream \"orders\" is already on cell \"a\"")),
                (move_to("orders", "b", 1), placed("b", 2, Some("a"))),
                (
                    move_to("orders", "c", 2),
                    invalid("stream \"orders\" is still moving from cell \"a\" at epoch 2; finish that move first"),
                ),
            ],
        ),
        (
            "a stream never placed",
            vec![
                (move_to("orders", "b", 1), Err(Rejection::NotPlaced { stream: "orders".into() })),
                (finish("orders", 1), Err(Rejection::NotPlaced { stream: "orders".into() })),
                (Command::Unplace { stream: "orders".into() }, Err(Rejection::NotPlaced { stream: "orders".into() })),
            ],
        ),
        (
            "unplaced, a stream may be placed anew",
            vec![
                (place("orders", "a"), placed("a", 1, None)),
                (Command::Unplace { stream: "orders".into() }, Ok(Outcome::Unplaced)),
                (place("orders", "b"), placed("b", 1, None)),
            ],
        ),
    ];
    for (case, steps) in cases {
        let mut h = directory();
        for (i, (command, expected)) in steps.into_iter().enumerate() {
            let description = format!("{command:?}");
            let before = common::state_parts(&h.cell);
            let got = h.apply(command);
            if got.is_err() {
                assert_eq!(common::state_parts(&h.cell), before, "{case}: step {i} ({description}) changed the state");
            }
            assert_eq!(got, expected, "{case}: step {i} ({description})");
        }
    }
}

#[test]
fn the_directory_lists_cells_and_placements_in_order_and_replaces_a_cells_addresses() {
    let mut h = directory();
    assert!(!h.cell.directory().is_empty(), "cells and no placements yet");
    assert_eq!(h.ok(put_cell("a")), Outcome::CellPut { created: false });
    h.ok(Command::PutCell { cell: "b".into(), addresses: vec!["b-9:7400".into()] });
    h.ok(place("zeta", "c"));
    h.ok(place("alpha", "b"));
    let d = h.cell.directory();
    let cells: Vec<(&str, Vec<String>)> = d.cells().map(|(name, addresses)| (&**name, addresses.to_vec())).collect();
    assert_eq!(cells[1], ("b", vec!["b-9:7400".to_string()]));
    assert_eq!(cells.iter().map(|(name, _)| *name).collect::<Vec<_>>(), ["a", "b", "c"]);
    let streams: Vec<&str> = d.placements().map(|(name, _)| &**name).collect();
    assert_eq!(streams, ["alpha", "zeta"]);
    assert_eq!(d.placement("alpha").map(|p| &*p.cell), Some("b"));
    assert_eq!(d.cell("b"), Some(&["b-9:7400".to_string()][..]));
    assert_eq!(d.cell("a").map(<[String]>::len), Some(2));
    assert_eq!(d.cell("z"), None);
    assert!(!d.is_empty());
    assert!(Harness::new().cell.directory().is_empty(), "a cell that is no directory records nothing");
}

#[test]
fn bad_directory_commands_are_refused_before_they_cost_anything() {
    let long = "x".repeat(300);
    let cases: Vec<(Command, &str)> = vec![
        (Command::PutCell { cell: "a".into(), addresses: vec![] }, "between 1 and 9 addresses"),
        (Command::PutCell { cell: "a".into(), addresses: vec!["h:1".into(); 10] }, "between 1 and 9 addresses"),
        (Command::PutCell { cell: "a".into(), addresses: vec!["h:1".into(), "h:1".into()] }, "given twice"),
        (Command::PutCell { cell: "a".into(), addresses: vec![long] }, "1 to 256 bytes"),
        (Command::PutCell { cell: "a".into(), addresses: vec!["h 1".into()] }, "whitespace"),
        (fence("orders", 0, "b"), "epoch is at least 1"),
        (accept("orders", 0), "epoch is at least 1"),
        (ingest("orders", 0, vec![], vec![]), "epoch is at least 1"),
        (ingest("orders", 2, vec![copied(0, 0, "x", None)], vec![]), "sequence is at least 1"),
        (ingest("orders", 2, vec![], vec![0; 1025]), "at most 1024"),
        (ingest("orders", 2, vec![copied(0, 1, "x", None); 10_001], vec![]), "at most 10000 messages"),
        (
            ingest(
                "orders",
                2,
                vec![IngestMessage {
                    request: cellog_core::PublishRequest { subject: "orders..x".into(), ..Default::default() },
                    ..copied(0, 1, "x", None)
                }],
                vec![],
            ),
            "orders..x",
        ),
    ];
    // A copy carries none of what only a publish asks for: each one alone refuses it.
    let plain = || common::keyed("orders.x", "k", "x");
    let producer = cellog_core::ProducerRef { producer_id: 1, epoch: 0 };
    let publish_only = [
        cellog_core::PublishRequest { expected_last_seq: Some(0), ..plain() },
        cellog_core::PublishRequest { expected_last_subject_seq: Some(0), ..plain() },
        cellog_core::PublishRequest { ttl_ms: Some(5), ..plain() },
        cellog_core::PublishRequest { deliver_after_ms: Some(5), ..plain() },
        cellog_core::PublishRequest { transaction: Some(producer), ..plain() },
    ];
    let cases = cases.into_iter().chain(publish_only.into_iter().map(|request| {
        let copy = IngestMessage { request, ..copied(0, 1, "x", None) };
        (ingest("orders", 2, vec![copy], vec![]), "no condition, TTL, delay or transaction")
    }));
    for (command, needle) in cases {
        let mut h = Harness::new();
        let description = format!("{command:?}");
        assert_eq!(command.check(), h.apply(command.clone()).map(|_| ()), "{description}: the host's check is apply's");
        let error = h.apply(command).expect_err(&description).to_string();
        assert!(error.contains(needle), "{description}: {error}");
        assert_eq!(h.cell.directory().cells().count(), 0);
    }
    let bad_name = Command::PutCell { cell: "a b".into(), addresses: vec!["h:1".into()] };
    assert!(matches!(bad_name.check(), Err(Rejection::InvalidName { kind: NameKind::Cell, .. })));
    let bad_stream = place("a b", "a");
    assert!(matches!(bad_stream.check(), Err(Rejection::InvalidName { kind: NameKind::Stream, .. })));
    let bad_unplace = Command::Unplace { stream: "a b".into() };
    assert!(matches!(bad_unplace.check(), Err(Rejection::InvalidName { kind: NameKind::Stream, .. })));
    assert_eq!(place("tenant/orders", "a").check(), Ok(()), "a tenant's stream is placed by its stored name");
    // The bounds themselves are taken: the most addresses, each of the most bytes.
    let mut h = Harness::new();
    let most: Vec<String> =
        (0..MAX_CELL_ADDRESSES).map(|i| format!("{i}{}", "h".repeat(MAX_ADDRESS_BYTES - 3)) + ":1").collect();
    assert!(most.iter().all(|address| address.len() == MAX_ADDRESS_BYTES));
    h.ok(Command::PutCell { cell: "a".into(), addresses: most.clone() });
    assert_eq!(h.cell.directory().cell("a").map(<[String]>::to_vec), Some(most));
}

/// A cell holding stream `orders` (two partitions) with a consumer, and messages in both partitions.
fn owner() -> Harness {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 2, ..config(&["orders.>"]) });
    h.create_consumer("orders", "billing", ConsumerConfig::default());
    h.ok(Command::Publish(common::keyed("orders.x", &common::key_for(0, 2), "one")));
    h.ok(Command::Publish(common::keyed("orders.x", &common::key_for(1, 2), "two")));
    h.ok(Command::Publish(common::keyed("orders.x", &common::key_for(1, 2), "three")));
    h
}

fn moved(epoch: u64, to: &str) -> Rejection {
    Rejection::Moved { stream: "orders".into(), cell: to.into(), epoch }
}

#[test]
fn a_fenced_owner_refuses_every_write_and_answers_where_its_log_ends() {
    let mut h = owner();
    let fenced = h.ok(fence("orders", 2, "b"));
    assert_eq!(
        fenced,
        Outcome::Ownership { ownership: Ownership::Moved { epoch: 2, to: "b".into() }, last_seqs: vec![1, 2] }
    );
    let before = h.cell.digest();
    let mut transactional = h.init_producer("t");
    assert_eq!(h.apply(Command::Publish(common::keyed("orders.x", "k", "four"))), Err(moved(2, "b")));
    let with_id = cellog_core::PublishRequest { msg_id: Some("m-1".into()), ..common::keyed("orders.y", "k", "5") };
    assert_eq!(h.apply(Command::Publish(with_id)), Err(moved(2, "b")), "even an id it may have seen");
    assert_eq!(h.apply(Command::Recall { stream: "orders".into(), partition: 0, seq: 1 }), Err(moved(2, "b")));
    let staged =
        cellog_core::PublishRequest { transaction: Some(transactional), ..common::keyed("orders.x", "k", "6") };
    h.ok(Command::BeginTransaction(transactional));
    assert_eq!(h.apply(Command::Publish(staged)), Err(moved(2, "b")), "nothing is staged either");
    h.ok(Command::AbortTransaction(transactional));
    transactional.epoch += 1;
    let _ = transactional;
    assert_eq!(common::n_messages(&h, "orders"), 3, "nothing was written");
    // Reads and consumers go on: what the stream held stays readable until it is deleted here.
    assert_eq!(h.fetch("orders", "billing", 10).len(), 3);
    assert_ne!(h.cell.digest(), before, "the fetch was a change of its own");
    // The same fence again is answered alike; an older one is stale, a newer one moves the owner on.
    assert_eq!(h.ok(fence("orders", 2, "b")), fenced);
    assert_eq!(h.apply(fence("orders", 1, "c")), stale("orders", 1, 2));
    assert_eq!(h.apply(fence("orders", 2, "c")), stale("orders", 2, 2));
    h.ok(fence("orders", 3, "c"));
    assert_eq!(h.apply(Command::Publish(common::keyed("orders.x", "k", "seven"))), Err(moved(3, "c")));
    // A cell that gave the stream away at an epoch cannot take it back by accepting at that epoch.
    assert_eq!(h.apply(accept("orders", 3)), stale("orders", 3, 3));
}

#[test]
fn a_transaction_staged_before_the_fence_cannot_commit_after_it() {
    let mut h = owner();
    let r = h.init_producer("t");
    h.ok(Command::BeginTransaction(r));
    let staged = cellog_core::PublishRequest { transaction: Some(r), ..common::keyed("orders.x", "k", "staged") };
    h.ok(Command::Publish(staged));
    h.ok(fence("orders", 2, "b"));
    let refused = h.apply(Command::CommitTransaction(r)).expect_err("the commit is refused");
    assert!(
        matches!(&refused, Rejection::TransactionAborted { reason } if reason.contains("moved to cell \"b\"")),
        "{refused}"
    );
    assert_eq!(common::n_messages(&h, "orders"), 3);
}

#[test]
fn a_dead_letter_stream_that_moved_away_gets_no_copy_here() {
    let mut h = Harness::new();
    h.create_stream("dead", config(&["dead.>"]));
    let source = StreamConfig { dead_letter_stream: Some("dead".into()), ..config(&["orders.>"]) };
    h.create_stream("orders", source);
    h.create_consumer("orders", "billing", ConsumerConfig::default());
    h.publish("orders.x", "one").unwrap();
    h.publish("orders.x", "two").unwrap();
    let deliveries = h.fetch("orders", "billing", 2);
    h.ack("orders", "billing", 0, deliveries[0].record.seq, AckKind::Failed).unwrap();
    assert_eq!(common::n_messages(&h, "dead"), 1, "a dead letter is copied while the stream is here");
    h.ok(fence("dead", 2, "b"));
    h.ack("orders", "billing", 0, deliveries[1].record.seq, AckKind::Failed).unwrap();
    assert_eq!(common::n_messages(&h, "dead"), 1, "and not once it moved");
}

#[test]
fn a_stream_moving_here_takes_writes_only_once_accepted() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let receiving = Ownership::Receiving { epoch: 2, from: "a".into() };
    assert_eq!(h.ok(receive("orders", 2, "a")), Outcome::Ownership { ownership: receiving, last_seqs: vec![0] });
    assert_eq!(
        h.apply(Command::Publish(common::keyed("orders.x", "k", "early"))),
        Err(Rejection::StreamMoving { stream: "orders".into(), from: "a".into(), epoch: 2 })
    );
    assert_eq!(
        h.apply(accept("orders", 3)).map(|_| ()),
        invalid("stream \"orders\" was not received at epoch 3; a cell accepts only a stream it is receiving")
            .map(|_| ())
    );
    assert_eq!(h.apply(accept("orders", 1)), stale("orders", 1, 2));
    let owned = Outcome::Ownership { ownership: Ownership::Owned { epoch: 2 }, last_seqs: vec![0] };
    assert_eq!(h.ok(accept("orders", 2)), owned);
    assert_eq!(h.ok(accept("orders", 2)), owned, "accepting again changes nothing");
    assert_eq!(h.apply(receive("orders", 2, "a")), stale("orders", 2, 2), "a late receive does not undo it");
    h.publish("orders.x", "now").unwrap();
    assert_eq!(h.cell.ownership("orders"), &Ownership::Owned { epoch: 2 });
}

#[test]
fn a_stream_deleted_and_created_again_under_a_moved_name_stays_fenced() {
    let mut h = owner();
    h.ok(fence("orders", 2, "b"));
    h.ok(Command::DeleteStream { name: "orders".into() });
    h.create_stream("orders", config(&["orders.>"]));
    assert_eq!(h.apply(Command::Publish(common::keyed("orders.x", "k", "x"))), Err(moved(2, "b")));
    // Moving it back here is a move like any other: received, then accepted, at a later epoch.
    h.ok(receive("orders", 3, "b"));
    h.ok(accept("orders", 3));
    h.publish("orders.x", "back").unwrap();
}

#[test]
fn ownership_and_the_directory_survive_a_snapshot_and_count_in_the_digest() {
    let mut h = owner();
    h.ok(put_cell("a"));
    h.ok(place("orders", "a"));
    let plain = h.cell.digest();
    h.ok(fence("orders", 2, "b"));
    assert_ne!(h.cell.digest(), plain);
    let parts: Vec<String> = h.cell.digest_parts().into_iter().map(|(part, _)| part).collect();
    assert!(parts.contains(&"directory".to_string()) && parts.contains(&"ownership".to_string()), "{parts:?}");
    let restored = cellog_core::Cell::restore(&h.cell.snapshot()).unwrap();
    assert_eq!(restored, h.cell);
    assert_eq!(restored.ownership("orders"), &Ownership::Moved { epoch: 2, to: "b".into() });
    assert_eq!(restored.directory().placement("orders").map(|p| p.epoch), Some(1));
}

/// Tenants never name cells: every directory and ownership command needs cluster admin.
#[test]
fn only_a_cluster_admin_places_or_fences() {
    let mut h = owner();
    let admin = cellog_core::Grants { cluster_admin: false, ..cellog_core::Grants::all() };
    h.ok(Command::PutPrincipal { name: "ops".into(), grants: admin });
    h.ok(Command::AddToken { principal: "ops".into(), token: common::token(1) });
    for command in [put_cell("a"), place("orders", "a"), fence("orders", 2, "b"), receive("orders", 2, "b")] {
        let description = format!("{command:?}");
        let refused = h.apply(common::as_token(1, command));
        assert!(matches!(refused, Err(Rejection::PermissionDenied { .. })), "{description}: {refused:?}");
    }
    assert_eq!(h.cell.ownership("orders"), &Ownership::Owned { epoch: 0 });
}

fn ingest(stream: &str, epoch: u64, messages: Vec<IngestMessage>, through: Vec<u64>) -> Command {
    Command::Ingest { stream: stream.into(), epoch, messages, through }
}

/// A message as a move copies it: at `partition`/`seq`, with an id when given.
fn copied(partition: u32, seq: u64, payload: &str, msg_id: Option<&str>) -> IngestMessage {
    let request = cellog_core::PublishRequest {
        msg_id: msg_id.map(Into::into),
        ..common::keyed("orders.x", &common::key_for(partition % 2, 2), payload)
    };
    IngestMessage { partition, seq, request }
}

/// What a cell holds of a stream: (partition, seq, id, payload), in partition and sequence order.
fn held(h: &Harness, stream: &str) -> Vec<(u32, u64, Option<String>, String)> {
    let n = h.cell.stream_info(stream).unwrap().partitions.len() as u32;
    (0..n)
        .flat_map(|p| h.cell.read_from(stream, p, 1, 100).unwrap())
        .map(|r| {
            let payload = String::from_utf8_lossy(&h.payload(&r)).into_owned();
            (r.partition, r.seq, r.msg_id.as_deref().map(Into::into), payload)
        })
        .collect()
}

/// The cell a stream moves to: the stream created as on the owner, receiving at epoch 2 from `a`.
fn receiver() -> Harness {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 2, ..config(&["orders.>"]) });
    h.ok(receive("orders", 2, "a"));
    h
}

#[test]
fn a_move_copies_every_message_at_its_position_and_ids_keep_deduplicating() {
    let mut a = owner();
    a.publish_id("orders.x", "four", "m-4").unwrap();
    a.ok(Command::Recall { stream: "orders".into(), partition: 1, seq: 1 });
    let Outcome::Ownership { last_seqs, .. } = a.ok(fence("orders", 2, "b")) else { panic!("a fence answers") };
    let records: Vec<IngestMessage> = (0..2)
        .flat_map(|p| a.cell.read_from("orders", p, 1, 100).unwrap())
        .filter(|r| matches!(r.body, cellog_core::Body::Stored(_)))
        .map(|r| IngestMessage {
            partition: r.partition,
            seq: r.seq,
            request: cellog_core::PublishRequest {
                msg_id: r.msg_id.as_deref().map(Into::into),
                key: r.key.clone(),
                headers: r.headers.clone(),
                ..cellog_core::PublishRequest::new(&*r.subject, a.payload(&r))
            },
        })
        .collect();
    let mut b = receiver();
    assert_eq!(
        b.apply(accept_through("orders", 2, &last_seqs)).map(|_| ()),
        invalid(&format!(
            "stream \"orders\" is not caught up: partition 0 holds through sequence 0 here, the cell it moves from \
             through {}",
            last_seqs[0]
        ))
        .map(|_| ()),
        "nothing copied yet"
    );
    let (first, rest) = records.split_at(1);
    assert_eq!(
        b.ok(ingest("orders", 2, first.to_vec(), vec![])),
        Outcome::Ingested { appended: 1, last_seqs: vec![1, 0] }
    );
    let before = common::state_parts(&b.cell);
    // The whole copy again (a retry after a lost answer): what is here is passed over.
    let answer = b.ok(ingest("orders", 2, records.clone(), last_seqs.clone()));
    assert_eq!(answer, Outcome::Ingested { appended: rest.len() as u32, last_seqs: last_seqs.clone() });
    assert_ne!(common::state_parts(&b.cell), before);
    let again = common::state_parts(&b.cell);
    assert_eq!(
        b.ok(ingest("orders", 2, records, last_seqs.clone())),
        Outcome::Ingested { appended: 0, last_seqs: last_seqs.clone() }
    );
    assert_eq!(common::state_parts(&b.cell), again, "a repeated copy changes nothing");
    // The recalled message was not copied: its place is a hole, and the partition goes on where the owner's did.
    let mut expected = held(&a, "orders");
    expected.retain(|(p, seq, ..)| (*p, *seq) != (1, 1));
    assert_eq!(held(&b, "orders"), expected);
    assert_eq!(
        b.apply(Command::Publish(common::keyed("orders.x", "k", "early"))).map(|_| ()),
        Err(Rejection::StreamMoving { stream: "orders".into(), from: "a".into(), epoch: 2 })
    );
    b.ok(accept_through("orders", 2, &last_seqs));
    let duplicate = b.publish_id("orders.x", "four again", "m-4").unwrap();
    assert!(duplicate.duplicate, "the id published on the old owner is known here: {duplicate:?}");
    let original = expected.iter().find(|(.., id, _)| id.as_deref() == Some("m-4")).expect("copied with its id");
    assert_eq!((duplicate.partition, duplicate.seq), (original.0, original.1), "at the position it has on both");
    let next = b.ok(Command::Publish(common::keyed("orders.x", &common::key_for(1, 2), "five")));
    let Outcome::Published(ack) = next else { panic!("{next:?}") };
    assert_eq!((ack.partition, ack.seq), (1, last_seqs[1] + 1), "the next write follows the owner's last position");
    let late = b.apply(ingest("orders", 2, vec![], vec![])).expect_err("accepted: nothing more is copied");
    assert!(late.to_string().contains("owned at epoch 2"), "{late}");
}

/// A move's copy of exactly [`MAX_INGEST_MESSAGES`] messages is taken whole; one more is refused (the table of bad
/// copies above).
#[test]
fn a_copy_of_the_most_messages_a_copy_carries_is_taken_whole() {
    let mut b = receiver();
    let most = MAX_INGEST_MESSAGES as u64;
    let messages: Vec<IngestMessage> = (1..=most).map(|seq| copied(0, seq, "x", None)).collect();
    assert_eq!(
        b.ok(ingest("orders", 2, messages, vec![])),
        Outcome::Ingested { appended: MAX_INGEST_MESSAGES as u32, last_seqs: vec![most, 0] }
    );
}

#[test]
fn a_copy_passes_over_what_the_owner_removed_and_goes_on_where_its_log_ended() {
    let mut b = receiver();
    // Partition 0 held 5..7 (1..4 were removed there), then 8 and 9 were removed too; partition 1 held nothing.
    let messages = vec![copied(0, 5, "five", Some("m-5")), copied(0, 7, "seven", None)];
    assert_eq!(
        b.ok(ingest("orders", 2, messages, vec![9, 0])),
        Outcome::Ingested { appended: 2, last_seqs: vec![9, 0] }
    );
    let kept: Vec<(u32, u64)> = held(&b, "orders").into_iter().map(|(p, seq, ..)| (p, seq)).collect();
    assert_eq!(kept, [(0, 5), (0, 7)]);
    b.ok(accept_through("orders", 2, &[9, 0]));
    let Outcome::Published(ack) = b.ok(Command::Publish(common::keyed("orders.x", &common::key_for(0, 2), "ten")))
    else {
        panic!("published")
    };
    assert_eq!(ack.seq, 10);
    // Removing the copies leaves the partition starting past them, as on the owner.
    b.ok(Command::Recall { stream: "orders".into(), partition: 0, seq: 5 });
    assert_eq!(b.cell.read("orders", 0, 10).map(|r| r.seq), Ok(10));
}

#[test]
fn bad_copies_are_refused_whole_and_change_nothing() {
    let gap = cellog_core::MAX_INGEST_GAP;
    let cases: Vec<(Command, &str)> = vec![
        (ingest("orders", 3, vec![copied(0, 1, "x", None)], vec![]), "not receiving at epoch 3"),
        (ingest("orders", 1, vec![copied(0, 1, "x", None)], vec![]), "epoch 1 is stale; the current epoch is 2"),
        (ingest("other", 2, vec![copied(0, 1, "x", None)], vec![]), "owned at epoch 0"),
        (ingest("orders", 2, vec![copied(2, 1, "x", None)], vec![]), "names partition 2"),
        (ingest("orders", 2, vec![copied(0, 3, "x", None), copied(0, 3, "y", None)], vec![]), "3 follows 3"),
        (ingest("orders", 2, vec![copied(0, 1, "x", None), copied(0, gap + 3, "y", None)], vec![]), "passes over more"),
        (ingest("orders", 2, vec![copied(0, 1, "x", None)], vec![gap + 5, 0]), "passes over more"),
        (ingest("orders", 2, vec![], vec![1]), "given for 1 partitions"),
        (ingest("orders", 2, vec![copied(1, 1, &"x".repeat(2 << 20), None)], vec![]), "payload"),
    ];
    for (command, needle) in cases {
        let mut b = receiver();
        let description = format!("{:.200}", format!("{command:?}"));
        let before = common::state_parts(&b.cell);
        let error = b.apply(command).expect_err(&description).to_string();
        assert!(error.to_lowercase().contains(needle), "{description}: {error}");
        assert_eq!(common::state_parts(&b.cell), before, "{description}");
    }
    // The first copy into an empty partition may start anywhere: the owner may have removed everything before it.
    let mut b = receiver();
    b.ok(ingest("orders", 2, vec![copied(0, gap * 4, "x", None)], vec![]));
    assert_eq!(b.cell.read("orders", 0, gap * 4).map(|r| r.seq), Ok(gap * 4));
}

/// The cell a stream moves from may list more partitions than the stream has here: accepted while those hold
/// nothing, refused (changing nothing) once one holds a message this cell has no partition for.
#[test]
fn an_accept_naming_more_partitions_is_taken_only_while_the_extra_ones_are_empty() {
    let mut b = receiver();
    let before = common::state_parts(&b.cell);
    let error = b.apply(accept_through("orders", 2, &[0, 0, 5])).expect_err("a third partition holds messages");
    assert!(error.to_string().contains("the cell it moves from has messages in more"), "{error}");
    assert_eq!(common::state_parts(&b.cell), before);
    b.ok(accept_through("orders", 2, &[0, 0, 0]));
    assert_eq!(b.cell.ownership("orders"), &Ownership::Owned { epoch: 2 });
}

#[test]
fn a_cell_receiving_a_stream_it_does_not_hold_creates_it_fenced_in_the_same_step() {
    let mut b = Harness::new();
    let orders = StreamConfig { partitions: 2, ..config(&["orders.>"]) };
    let step = Command::ReceiveStream { stream: "orders".into(), epoch: 2, from: "a".into(), config: Some(orders) };
    let receiving = Ownership::Receiving { epoch: 2, from: "a".into() };
    assert_eq!(b.ok(step.clone()), Outcome::Ownership { ownership: receiving.clone(), last_seqs: vec![0, 0] });
    assert_eq!(
        b.apply(Command::Publish(common::keyed("orders.x", "k", "early"))),
        Err(Rejection::StreamMoving { stream: "orders".into(), from: "a".into(), epoch: 2 }),
        "a publish routed here finds the stream and waits"
    );
    let before = common::state_parts(&b.cell);
    assert_eq!(b.ok(step), Outcome::Ownership { ownership: receiving, last_seqs: vec![0, 0] });
    assert_eq!(common::state_parts(&b.cell), before, "the same step again changes nothing");
    // A stale step creates nothing; a config that cannot be created refuses the whole step.
    let stale_step =
        Command::ReceiveStream { stream: "jobs".into(), epoch: 1, from: "a".into(), config: Some(config(&["jobs.>"])) };
    b.ok(receive("jobs", 3, "a"));
    assert_eq!(b.apply(stale_step), stale("jobs", 1, 3));
    let overlapping = Command::ReceiveStream {
        stream: "audit".into(),
        epoch: 2,
        from: "a".into(),
        config: Some(config(&["orders.x"])),
    };
    let before = common::state_parts(&b.cell);
    assert!(b.apply(overlapping).is_err(), "its subjects overlap orders'");
    assert_eq!(common::state_parts(&b.cell), before);
    assert_eq!(b.cell.ownership("audit"), &Ownership::Owned { epoch: 0 });
}
