//! Each checker against hand-written histories: a table of histories that must pass, and of histories that must fail
//! with exactly the checkers named (so that a checker that stops seeing its violation, or starts seeing one where
//! there is none, fails here).

use bytes::Bytes;
use cellog_check::check_all;
use cellog_check::script::Script;

const NODES: [u64; 3] = [1, 2, 3];

/// `msg_id` published by `producer` at `at`, acknowledged at `stream`/0/`seq`, and held there by every node.
fn acked(s: &mut Script, at: u64, msg_id: &str, stream: &str, seq: u64) {
    s.publish(at, "producer", msg_id).published(at + 2, stream, 0, seq);
    for node in NODES {
        s.hold(node, stream, msg_id, 0, seq, at + 1);
    }
}

/// Every node holds `msg_id` at `stream`/0/`seq`.
fn everywhere(s: &mut Script, stream: &str, msg_id: &str, seq: u64, at: u64) {
    for node in NODES {
        s.hold(node, stream, msg_id, 0, seq, at);
    }
}

/// A run with something of everything, and nothing wrong: acknowledged publishes delivered to a durable consumer
/// and acked, a delayed message not yet due, a committed transaction, a producer fenced by a newer instance whose
/// commit is refused, a mirror that read its feed in order while retention trimmed behind it.
fn clean(s: &mut Script) {
    s.drained("orders", "audit");
    acked(s, 0, "m-1", "orders", 1);
    acked(s, 10, "m-2", "orders", 2);
    s.publish_delayed(20, "producer", "d-3", 60_000).published(22, "orders", 0, 3);
    everywhere(s, "orders", "d-3", 3, 21);
    s.fetch(30, "audit").messages(32, &[(0, 1, "m-1", 1), (0, 2, "m-2", 1)]);
    s.ack(40, "audit", "ack", 0, 1).done(41);
    s.ack(40, "audit", "ack", 0, 2).done(41);
    s.fetch(50, "audit").messages(52, &[]);
    // A transaction of producer 7 at epoch 1, committed.
    s.init(60, "txn", "orders-txn").producer(61, 7, 1);
    s.txn(62, "txn", "begin", (7, 1)).done(63);
    s.stage(64, "txn", "t-1", (7, 1)).staged(65);
    s.stage(66, "txn", "t-2", (7, 1)).staged(67);
    s.txn(68, "txn", "prepare", (7, 1)).done(69);
    s.txn(70, "txn", "commit", (7, 1)).messages(71, &[(0, 4, "t-1", 0), (0, 5, "t-2", 0)]);
    everywhere(s, "orders", "t-1", 4, 70);
    everywhere(s, "orders", "t-2", 5, 70);
    // A newer instance at epoch 2 fences epoch 1, whose later attempts are refused.
    s.init(80, "txn", "orders-txn").producer(81, 7, 2);
    s.txn(82, "zombie", "begin", (7, 1)).fail(83);
    s.stage(84, "zombie", "z-1", (7, 1)).fail(85);
    s.txn(86, "zombie", "commit", (7, 1)).fail(87);
    // A feed mirrored by a registered peer: retention removed f-1 once the mirror had it.
    s.peer("feed", "mirror");
    s.publish(90, "producer", "f-1").published(91, "feed", 0, 1);
    s.publish(92, "producer", "f-2").published(93, "feed", 0, 2);
    s.read(94, "mirror", "feed", 0, 1).messages(95, &[(0, 1, "f-1", 0)]);
    s.progress(96, "mirror", "feed", 0, 1).done(97);
    s.read(98, "mirror", "feed", 0, 2).messages(99, &[(0, 2, "f-2", 0)]);
    everywhere(s, "feed", "f-2", 2, 93);
}

/// A source stream `feed` holding f-1 to f-4 on every node (acknowledged), mirrored by `copy`.
fn mirrored(s: &mut Script) {
    s.mirror("copy", "feed");
    for seq in 1..=4 {
        acked(s, seq * 10, &format!("f-{seq}"), "feed", seq);
    }
}

/// A history and the checkers it must fail (none: it must pass).
struct Row {
    name: &'static str,
    history: fn(&mut Script),
    fails: &'static [&'static str],
}

const ROWS: &[Row] = &[
    Row { name: "a clean run", history: clean, fails: &[] },
    Row {
        name: "a publish outside its principal's grants is refused, one inside lands",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.publish_to(0, "intruder", "x-1", "orders.0").fail(1);
            s.publish_to(2, "intruder", "x-2", "orders.1").unknown(9);
            s.publish_to(10, "intruder", "j-1", "jobs.build").published(11, "jobs", 0, 1);
            everywhere(s, "jobs", "j-1", 1, 11);
        },
        fails: &[],
    },
    Row {
        name: "a publish outside its principal's grants acknowledged",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.publish_to(0, "intruder", "x-1", "orders.0").published(1, "orders", 0, 1);
            everywhere(s, "orders", "x-1", 1, 1);
        },
        fails: &["grants"],
    },
    Row {
        name: "a publish outside its principal's grants that timed out, stored",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.publish_to(0, "intruder", "x-1", "orders.0").unknown(9);
            everywhere(s, "orders", "x-1", 1, 1);
        },
        fails: &["grants"],
    },
    Row {
        name: "a forged sender inside the grants is refused",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.forged("forged-1");
            s.publish_to(0, "intruder", "forged-1", "jobs.build").fail(1);
        },
        fails: &[],
    },
    Row {
        name: "a forged sender inside the grants acknowledged",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.forged("forged-1");
            s.publish_to(0, "intruder", "forged-1", "jobs.build").published(1, "jobs", 0, 1);
            everywhere(s, "jobs", "forged-1", 1, 1);
        },
        fails: &["grants"],
    },
    Row {
        name: "a forged sender that timed out, stored",
        history: |s| {
            s.publisher("intruder", &["jobs.*"]);
            s.forged("forged-1");
            s.publish_to(0, "intruder", "forged-1", "jobs.build").unknown(9);
            everywhere(s, "jobs", "forged-1", 1, 1);
        },
        fails: &["grants"],
    },
    Row {
        name: "a publish that timed out may be stored",
        history: |s| {
            s.publish(0, "producer", "m-1").unknown(5);
            everywhere(s, "orders", "m-1", 1, 1);
        },
        fails: &[],
    },
    Row {
        name: "a fetch under way when an ack was answered may still carry the message",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.fetch(10, "audit").messages(11, &[(0, 1, "m-1", 1)]);
            s.fetch(20, "audit").messages(30, &[(0, 1, "m-1", 2)]);
            s.ack(21, "audit", "ack", 0, 1).done(22);
        },
        fails: &[],
    },
    Row {
        name: "a lost ack",
        history: |s| {
            s.publish(0, "producer", "m-1").published(2, "orders", 0, 1);
            s.hold(1, "orders", "m-1", 0, 1, 1);
            s.hold(2, "orders", "m-1", 0, 1, 1);
            s.node(3, "orders");
        },
        fails: &["lost", "replicas"],
    },
    Row {
        name: "a message held twice",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            everywhere(s, "orders", "m-1", 2, 5);
        },
        fails: &["duplicate"],
    },
    Row {
        name: "one id acknowledged at two sequences",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.publish(10, "producer", "m-1").published(12, "orders", 0, 2);
        },
        fails: &["duplicate", "lost"],
    },
    Row {
        name: "two ids acknowledged at one sequence",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.publish(10, "producer", "m-2").published(12, "orders", 0, 1);
        },
        fails: &["position", "lost"],
    },
    Row {
        name: "replicas with other bytes at one position",
        history: |s| {
            s.publish(0, "producer", "m-1").published(2, "orders", 0, 1);
            s.hold(1, "orders", "m-1", 0, 1, 1);
            s.hold(2, "orders", "m-1", 0, 1, 1);
            s.hold_body(3, "orders", "m-1", (0, 1, 1), Bytes::from_static(b"flipped"));
        },
        fails: &["replicas", "intact"],
    },
    Row {
        name: "every replica holds a body no publish carried (a corrupt entry its leader passed on)",
        history: |s| {
            s.publish(0, "producer", "m-1").published(2, "orders", 0, 1);
            for node in NODES {
                s.hold_body(node, "orders", "m-1", (0, 1, 1), Bytes::from_static(b"flipped"));
            }
        },
        fails: &["intact"],
    },
    Row {
        name: "a consumer handed a corrupt body that a replica served and later repaired",
        history: |s| {
            s.drained("orders", "audit");
            acked(s, 0, "m-1", "orders", 1);
            s.fetch(10, "audit").message_with_body(11, (0, 1, "m-1"), b"m-0");
            s.ack(12, "audit", "ack", 0, 1).done(13);
        },
        fails: &["intact"],
    },
    Row {
        name: "a reader handed a corrupt body",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.read(10, "reader", "orders", 0, 1).message_with_body(11, (0, 1, "m-1"), b"");
        },
        fails: &["intact"],
    },
    Row {
        name: "a message id no publish in the history carried is not judged by its body",
        history: |s| {
            s.read(10, "reader", "orders", 0, 1).message_with_body(11, (0, 1, "other"), b"anything");
        },
        fails: &[],
    },
    Row {
        name: "a torn transaction",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.stage(4, "txn", "t-2", (7, 1)).staged(5);
            s.txn(6, "txn", "commit", (7, 1)).unknown(9);
            everywhere(s, "orders", "t-1", 1, 6);
        },
        fails: &["transactions"],
    },
    Row {
        name: "an acknowledged commit that no node shows",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.txn(6, "txn", "commit", (7, 1)).done(9);
            s.node(1, "orders");
        },
        fails: &["transactions"],
    },
    Row {
        name: "a refused commit that nodes show",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.txn(6, "txn", "commit", (7, 1)).fail(9);
            everywhere(s, "orders", "t-1", 1, 6);
        },
        fails: &["transactions"],
    },
    Row {
        name: "an acknowledged abort that nodes show",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.txn(6, "txn", "abort", (7, 1)).done(9);
            everywhere(s, "orders", "t-1", 1, 6);
        },
        fails: &["transactions"],
    },
    Row {
        name: "a drained consumer that never acked a message",
        history: |s| {
            s.drained("orders", "audit");
            acked(s, 0, "m-1", "orders", 1);
            acked(s, 5, "m-2", "orders", 2);
            s.fetch(10, "audit").messages(11, &[(0, 1, "m-1", 1), (0, 2, "m-2", 1)]);
            s.ack(12, "audit", "ack", 0, 1).done(13);
            s.ack(12, "audit", "nack", 0, 2).done(13);
        },
        fails: &["processed"],
    },
    Row {
        name: "an ack without an answer may have landed",
        history: |s| {
            s.drained("orders", "audit");
            acked(s, 0, "m-1", "orders", 1);
            s.fetch(10, "audit").messages(11, &[(0, 1, "m-1", 1)]);
            s.ack(12, "audit", "ack", 0, 1).unknown(20);
        },
        fails: &[],
    },
    Row {
        name: "an aborted read",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.txn(6, "txn", "abort", (7, 1)).done(9);
            s.node(1, "orders");
            s.fetch(10, "audit").messages(11, &[(0, 1, "t-1", 1)]);
        },
        fails: &["transactions"],
    },
    Row {
        name: "a fenced commit",
        history: |s| {
            s.init(0, "txn", "orders-txn").producer(1, 7, 1);
            s.init(10, "txn", "orders-txn").producer(11, 7, 2);
            s.txn(20, "zombie", "begin", (7, 1)).done(21);
            s.txn(22, "zombie", "commit", (7, 1)).done(23);
        },
        fails: &["fenced"],
    },
    Row {
        name: "a fenced producer's message shown",
        history: |s| {
            s.init(0, "txn", "orders-txn").producer(1, 7, 1);
            s.init(10, "txn", "orders-txn").producer(11, 7, 2);
            s.txn(20, "zombie", "begin", (7, 1)).done(21);
            s.stage(22, "zombie", "z-1", (7, 1)).staged(23);
            s.txn(24, "zombie", "commit", (7, 1)).unknown(25);
            everywhere(s, "orders", "z-1", 1, 24);
        },
        fails: &["fenced"],
    },
    Row {
        name: "a redelivery after ack",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.fetch(10, "audit").messages(11, &[(0, 1, "m-1", 1)]);
            s.ack(12, "audit", "ack", 0, 1).done(13);
            s.fetch(20, "audit").messages(21, &[(0, 1, "m-1", 2)]);
        },
        fails: &["redelivery"],
    },
    Row {
        name: "an acknowledged message never delivered",
        history: |s| {
            s.durable("orders", "audit");
            acked(s, 0, "m-1", "orders", 1);
            acked(s, 5, "m-2", "orders", 2);
            s.fetch(10, "audit").messages(11, &[(0, 1, "m-1", 1)]);
        },
        fails: &["delivery"],
    },
    Row {
        name: "a delivery before its time",
        history: |s| {
            s.publish_delayed(0, "producer", "d-1", 60_000).published(2, "orders", 0, 1);
            everywhere(s, "orders", "d-1", 1, 1);
            s.fetch(10, "audit").messages(11, &[(0, 1, "d-1", 1)]);
        },
        fails: &["delayed"],
    },
    Row {
        name: "time going backwards",
        history: |s| {
            acked(s, 0, "m-1", "orders", 1);
            s.publish(10, "producer", "m-2").published(12, "orders", 0, 2);
            for node in NODES {
                s.hold(node, "orders", "m-2", 0, 2, 0);
            }
        },
        fails: &["cell-time"],
    },
    Row {
        name: "a gap under a peer's watermark",
        history: |s| {
            s.peer("feed", "mirror");
            for seq in 1..=3 {
                acked(s, seq * 10, &format!("f-{seq}"), "feed", seq);
            }
            s.read(40, "mirror", "feed", 0, 1).messages(41, &[(0, 1, "f-1", 0), (0, 3, "f-3", 0)]);
        },
        fails: &["watermark"],
    },
    Row {
        name: "a peer's read of a stream other than its feed is not held to the feed's watermark",
        history: |s| {
            s.peer("feed", "mirror");
            acked(s, 0, "o-1", "orders", 1);
            acked(s, 10, "o-3", "orders", 3);
            s.read(20, "mirror", "orders", 0, 1).messages(21, &[(0, 1, "o-1", 0), (0, 3, "o-3", 0)]);
        },
        fails: &[],
    },
    Row {
        name: "a removal past a peer's watermark",
        history: |s| {
            s.peer("feed", "mirror");
            s.publish(0, "producer", "f-1").published(1, "feed", 0, 1);
            acked(s, 10, "f-2", "feed", 2);
            s.publish(20, "producer", "f-3").published(21, "feed", 0, 3);
            s.progress(30, "mirror", "feed", 0, 1).done(31);
        },
        fails: &["watermark"],
    },
    Row {
        name: "a refused publish stored",
        history: |s| {
            s.publish(0, "producer", "m-1").fail(2);
            everywhere(s, "orders", "m-1", 1, 1);
        },
        fails: &["unknown"],
    },
    Row {
        name: "a refused publish read by a mirror, then removed",
        history: |s| {
            s.publish(0, "producer", "f-1").fail(2);
            s.read(5, "mirror", "feed", 0, 1).messages(6, &[(0, 1, "f-1", 0)]);
            s.node(1, "feed");
        },
        fails: &["unknown"],
    },
    Row {
        name: "reads that go back",
        history: |s| {
            s.fetch(0, "audit").messages(1, &[(0, 5, "m-5", 1)]);
            s.fetch(2, "audit").messages(3, &[(0, 3, "m-3", 1)]);
        },
        fails: &["monotonic"],
    },
    Row {
        name: "a commit that lands its messages out of order",
        history: |s| {
            s.txn(0, "txn", "begin", (7, 1)).done(1);
            s.stage(2, "txn", "t-1", (7, 1)).staged(3);
            s.stage(4, "txn", "t-2", (7, 1)).staged(5);
            s.txn(6, "txn", "commit", (7, 1)).messages(7, &[(0, 2, "t-1", 0), (0, 1, "t-2", 0)]);
            everywhere(s, "orders", "t-1", 2, 6);
            everywhere(s, "orders", "t-2", 1, 6);
        },
        fails: &["order"],
    },
    Row {
        name: "group members that hand a partition over through a new generation, and a fenced incarnation refused",
        history: |s| {
            s.join(0, "w1", "crew", "a").assigned(1, 1, &[0, 1]);
            s.member_fetch(2, "w1", ("crew", "a"), 1).member_messages(3, 1, &[(0, 1, "t-1", 1), (1, 1, "t-2", 1)]);
            s.join(4, "w2", "crew", "b").assigned(5, 2, &[]);
            s.member_fetch(6, "w1", ("crew", "a"), 1).member_messages(7, 2, &[(0, 2, "t-3", 1)]);
            s.member_fetch(8, "w2", ("crew", "b"), 3).member_messages(9, 3, &[(1, 1, "t-2", 2)]);
            s.join(10, "w1-again", "crew", "a").assigned(11, 4, &[0]);
            s.member_ack(12, "w1", ("crew", "a"), 1, (0, 1)).fail(13);
            s.member_ack(14, "w1-again", ("crew", "a"), 4, (0, 1)).done(15);
        },
        fails: &[],
    },
    Row {
        name: "one partition handed to two members at one generation",
        history: |s| {
            s.member_fetch(0, "w1", ("crew", "a"), 1).member_messages(1, 2, &[(0, 1, "t-1", 1)]);
            s.member_fetch(2, "w2", ("crew", "b"), 2).member_messages(3, 2, &[(0, 2, "t-2", 1)]);
        },
        fails: &["group", "handover"],
    },
    Row {
        name: "a partition handed over with its unacknowledged message first, and one whose message was acknowledged",
        history: |s| {
            s.member_fetch(0, "w1", ("crew", "a"), 1).member_messages(1, 1, &[(0, 1, "t-1", 1), (1, 1, "t-2", 1)]);
            s.member_ack(2, "w1", ("crew", "a"), 1, (1, 1)).done(3);
            s.member_fetch(4, "w2", ("crew", "b"), 2).member_messages(5, 2, &[(0, 1, "t-1", 2), (0, 2, "t-3", 1)]);
            s.member_fetch(6, "w2", ("crew", "b"), 2).member_messages(7, 2, &[(1, 2, "t-4", 1)]);
            s.member_ack(8, "w2", ("crew", "b"), 2, (0, 1)).done(9);
            s.member_ack(10, "w2", ("crew", "b"), 2, (0, 2)).done(11);
            s.member_fetch(12, "w1", ("crew", "a"), 3).member_messages(13, 3, &[(0, 4, "t-5", 1)]);
            // An ack begun before a fetch ended may have landed before it.
            s.member_ack(14, "w1", ("crew", "a"), 3, (0, 4)).unknown(40);
            s.member_fetch(15, "w2", ("crew", "b"), 4).member_messages(16, 4, &[(0, 5, "t-6", 1)]);
            s.member_ack(17, "w2", ("crew", "b"), 4, (0, 5)).done(18);
            s.member_fetch(20, "w3", ("crew", "c"), 5).member_messages(21, 5, &[(0, 6, "t-7", 1)]);
        },
        fails: &[],
    },
    Row {
        name: "a new owner handed a newer message while the old owner's is still unacknowledged",
        history: |s| {
            s.member_fetch(0, "w1", ("crew", "a"), 1).member_messages(1, 1, &[(0, 1, "t-1", 1)]);
            s.member_ack(2, "w1", ("crew", "a"), 1, (0, 1)).fail(3);
            s.member_fetch(4, "w2", ("crew", "b"), 2).member_messages(5, 2, &[(0, 2, "t-2", 1)]);
        },
        fails: &["handover"],
    },
    Row {
        name: "a member that joined again is handed a newer message while its earlier incarnation's is unacknowledged",
        history: |s| {
            s.join(0, "w1", "crew", "a").assigned(1, 1, &[0]);
            s.member_fetch(2, "w1", ("crew", "a"), 1).member_messages(3, 1, &[(0, 1, "t-1", 1)]);
            s.join(4, "w1-again", "crew", "a").assigned(5, 2, &[0]);
            s.member_fetch(6, "w1-again", ("crew", "a"), 2).member_messages(7, 2, &[(0, 2, "t-2", 1)]);
        },
        fails: &["handover"],
    },
    Row {
        name: "an earlier incarnation's ack lands after the member joined again",
        history: |s| {
            s.join(0, "w1", "crew", "a").assigned(1, 1, &[0]);
            s.join(2, "w1-again", "crew", "a").assigned(3, 2, &[0]);
            s.member_ack(4, "w1", ("crew", "a"), 1, (0, 1)).done(5);
        },
        fails: &["group"],
    },
    Row {
        name: "a mirror holding its source's first messages at their positions (not caught up yet)",
        history: |s| {
            mirrored(s);
            for node in NODES {
                for seq in 1..=3 {
                    s.hold(node, "copy", &format!("f-{seq}"), 0, seq, 100);
                }
            }
        },
        fails: &[],
    },
    Row {
        name: "a mirror that passed over a range of its source",
        history: |s| {
            mirrored(s);
            for seq in [1, 4] {
                s.hold(1, "copy", &format!("f-{seq}"), 0, seq, 100);
            }
        },
        fails: &["mirror"],
    },
    Row {
        name: "a mirror holding a message at another position than its source",
        history: |s| {
            mirrored(s);
            s.hold(1, "copy", "f-1", 0, 1, 100);
            s.hold(1, "copy", "f-3", 0, 2, 100);
        },
        fails: &["mirror"],
    },
    Row {
        name: "a mirror holding a message its source never had",
        history: |s| {
            mirrored(s);
            s.hold(1, "copy", "f-1", 0, 1, 100);
            s.hold(1, "copy", "x-9", 0, 5, 100);
        },
        fails: &["mirror"],
    },
    Row {
        name: "a mirror holding another body under a message's id",
        history: |s| {
            mirrored(s);
            s.hold_body(1, "copy", "f-1", (0, 1, 100), Bytes::from_static(b"tampered"));
        },
        // A body no publish carried is also what `intact` looks for.
        fails: &["intact", "mirror"],
    },
    Row {
        name: "replicas at different indexes may differ",
        history: |s| {
            s.state(1, 10, &[("cell", "a"), ("stream orders", "b")]);
            s.state(2, 12, &[("cell", "c"), ("stream orders", "d")]);
        },
        fails: &[],
    },
    Row {
        name: "replicas at one index with a consumer of their own",
        history: |s| {
            let parts = [("cell", "a"), ("stream orders", "b"), ("stream orders consumer audit", "c")];
            s.state(1, 10, &parts);
            s.state(2, 10, &parts);
            s.state(3, 10, &[("cell", "a"), ("stream orders", "x"), ("stream orders consumer audit", "y")]);
        },
        fails: &["state"],
    },
    Row {
        name: "a replica that went its own way for a while, read during the run",
        history: |s| {
            let parts = [("cell", "a"), ("stream orders", "b"), ("stream orders consumer audit", "c")];
            s.sample(1, 7, &parts);
            s.sample(2, 7, &[("cell", "a"), ("stream orders", "x")]);
            s.state(1, 10, &parts);
            s.state(2, 10, &parts);
        },
        fails: &["state"],
    },
    Row {
        name: "replicas read during the run at different indexes, the same at the end",
        history: |s| {
            let parts = [("cell", "a"), ("stream orders", "b")];
            s.sample(1, 7, &[("cell", "a"), ("stream orders", "x")]);
            s.sample(2, 8, &[("cell", "c"), ("stream orders", "y")]);
            s.sample(2, 10, &parts);
            s.state(1, 10, &parts);
            s.state(2, 10, &parts);
        },
        fails: &[],
    },
];

#[test]
fn each_history_fails_exactly_the_checkers_it_should() {
    let mut wrong = Vec::new();
    for row in ROWS {
        let mut script = Script::default();
        (row.history)(&mut script);
        let mut failed: Vec<&str> = check_all(&script.evidence()).iter().map(|v| v.checker).collect();
        failed.sort_unstable();
        let mut expected = row.fails.to_vec();
        expected.sort_unstable();
        if failed != expected {
            let found: Vec<String> =
                check_all(&script.evidence()).iter().map(|v| format!("{}: {}", v.checker, v.found)).collect();
            wrong.push(format!("{}: expected {expected:?}, failed {failed:?} ({found:?})", row.name));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_checker_is_shown_a_history_it_must_fail() {
    let shown: std::collections::BTreeSet<&str> = ROWS.iter().flat_map(|row| row.fails.iter().copied()).collect();
    let untested: Vec<&str> = cellog_check::ALL.iter().map(|c| c.name).filter(|name| !shown.contains(name)).collect();
    assert!(untested.is_empty(), "checkers no history fails: {untested:?}");
}

#[test]
fn a_state_difference_names_the_finest_part() {
    let mut script = Script::default();
    script.state(
        1,
        10,
        &[("stream orders", "b"), ("stream orders consumer audit", "c"), ("stream orders partition 0", "p")],
    );
    script.state(
        2,
        10,
        &[("stream orders", "x"), ("stream orders consumer audit", "y"), ("stream orders partition 0", "p")],
    );
    let violations = check_all(&script.evidence());
    assert_eq!(violations[0].found, "nodes 1 and 2 both applied 10 and differ in stream orders consumer audit");
}

#[test]
fn a_violation_says_where_it_is() {
    let mut script = Script::default();
    script.publish(0, "producer", "m-1").published(2, "orders", 0, 1);
    script.hold(1, "orders", "m-1", 0, 1, 1);
    script.hold_body(2, "orders", "m-1", (0, 1, 1), Bytes::from_static(b"flipped"));
    let found: Vec<(&str, String)> =
        check_all(&script.evidence()).into_iter().map(|violation| (violation.checker, violation.found)).collect();
    assert_eq!(
        found,
        [
            (
                "replicas",
                "nodes 1 and 2 differ in orders at 0/1: m-1 (3 bytes) against m-1 (7 bytes) with other bytes".into()
            ),
            ("intact", "node 2 holds m-1 in orders at 0/1 with a body no publish of it carried (7 bytes)".into()),
        ]
    );
    let mut script = Script::default();
    script.publish(0, "producer", "m-1").published(2, "orders", 0, 1);
    script.read(3, "reader", "orders", 0, 1).message_with_body(4, (0, 1, "m-1"), b"m-0");
    let found: Vec<String> = check_all(&script.evidence()).into_iter().map(|violation| violation.found).collect();
    assert!(
        found
            .iter()
            .any(|found| found.starts_with("reader was handed m-1 at 0/1 with a body no publish of it carried")),
        "{found:?}"
    );
}
