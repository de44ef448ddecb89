//! The fuzz targets: everything that decodes bytes from outside, each a function of bytes that must not panic.
//!
//! - `command`: a log entry's request (as Raft carries and the log keeps it), decoded and every command applied to a
//!   cell that holds streams, consumers, messages, a producer with an open transaction and principals;
//! - `client-request`: gRPC request bodies (publish, create stream, create consumer), decoded, converted into
//!   commands as a node does, and applied;
//! - `raft-message`: a peer's frame with a valid checksum (a forger computes crc32c too), decoded as each Raft
//!   request;
//! - `log-record`: a stored log record, as read (its checksum checked) and as it would be with a checksum that matches;
//! - `snapshot`: snapshot bytes, as read and re-checksummed, restored with and without bodies and re-encoded;
//! - `envelope`: sealed mail from another cell, decoded and opened.
//!
//! Shared by the workspace's fuzz tests (`tests/targets.rs`: mutation from the corpus, on stable Rust, in every test
//! run) and the coverage-guided harness (`afl/`, AFL++ through cargo-afl, run by `scripts/fuzz-afl`). The including
//! file names the `fuzz` directory as `FUZZ_DIR`.

use std::path::PathBuf;
use std::sync::OnceLock;

use bytes::Bytes;
use cellog_core::{
    AckItem, AckKind, Actor, Cell, Command, ConsumerConfig, Grants, GroupMember, Millis, ProducerRef, PublishRequest,
    StreamConfig, TokenHash,
};
use cellog_envelope::{CellKey, Keyring};
use cellog_proto::v1;
use cellog_raft::identity::CellIdentity;
use cellog_raft::network::{Frame, frame_message, unframe_message};
use cellog_raft::storage::{Space, frame, unframe};
use cellog_raft::{Entry, NodeId, Request, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, LogId, SnapshotMeta, StoredMembership, Vote};
use prost::Message;

/// The `fuzz` directory, where the corpora are.
fn root() -> PathBuf {
    PathBuf::from(super::FUZZ_DIR)
}

pub fn corpus_dir(target: &str) -> PathBuf {
    root().join("corpus").join(target)
}

// ----- the state inputs are applied to -----

pub const AT: Millis = Millis(1_000_000);

fn token(n: u8) -> TokenHash {
    TokenHash([n; 32])
}

/// A cell with something of everything a command may name: two streams (one partitioned), consumers, messages,
/// a producer with an open transaction, a principal with a token, reserved subjects.
pub fn prepared() -> &'static Cell {
    static CELL: OnceLock<Cell> = OnceLock::new();
    CELL.get_or_init(|| {
        let mut cell = Cell::new();
        for command in setup() {
            let outcome = cell.apply(AT, command);
            assert!(outcome.is_ok(), "{outcome:?}");
            cell.drain_work().for_each(drop);
        }
        cell
    })
}

/// A member joining the consumer group `g` of `orders`.
fn join(member: &str) -> Command {
    Command::JoinGroup {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        strategy: cellog_core::Strategy::CooperativeSticky,
        session_timeout_ms: 10_000,
        config: ConsumerConfig::default(),
    }
}

fn setup() -> Vec<Command> {
    let publish = |subject: &str, id: &str| {
        let mut request = PublishRequest::new(subject, Bytes::from_static(b"payload"));
        request.msg_id = Some(id.to_string());
        Command::Publish(request)
    };
    vec![
        Command::CreateStream {
            name: "orders".into(),
            config: StreamConfig { partitions: 2, ..StreamConfig::with_subjects(["orders.>"]) },
        },
        Command::CreateStream { name: "jobs".into(), config: StreamConfig::with_subjects(["jobs.*"]) },
        Command::CreateConsumer { stream: "orders".into(), name: "c".into(), config: ConsumerConfig::default() },
        Command::CreateConsumer { stream: "jobs".into(), name: "w".into(), config: ConsumerConfig::default() },
        join("m1"),
        join("m2"),
        publish("orders.eu", "o-1"),
        publish("orders.us", "o-2"),
        publish("jobs.build", "j-1"),
        Command::Fetch { stream: "orders".into(), consumer: "c".into(), member: "m".into(), max: 1 },
        Command::InitProducer { transactional_id: "tx".into(), transaction_timeout_ms: 60_000 },
        Command::BeginTransaction(ProducerRef { producer_id: 1, epoch: 0 }),
        Command::PutPrincipal { name: "alice".into(), grants: Grants::all() },
        Command::AddToken { principal: "alice".into(), token: token(1) },
        Command::ReserveSubjects { filter: "mail.>".into() },
    ]
}

/// Applies `commands` at `at` to a copy of the prepared cell, as a replica applies an entry, then snapshots it.
fn apply(at: Millis, commands: Vec<Command>) {
    let mut cell = prepared().clone();
    for command in commands {
        let _ = cell.apply(at, command);
        cell.drain_work().for_each(drop);
    }
    let restored = Cell::restore(&cell.snapshot()).expect("a cell restores from its own snapshot");
    assert!(restored == cell, "a snapshot round trip changed the state");
}

/// Valid requests, one of every kind of command.
pub fn requests() -> Vec<Request> {
    let r = ProducerRef { producer_id: 1, epoch: 0 };
    let mut transactional = PublishRequest::new("orders.eu", Bytes::from_static(b"staged"));
    transactional.transaction = Some(r);
    transactional.key = Some(Bytes::from_static(b"k"));
    transactional.headers.insert("h".into(), "v".into());
    let kinds = vec![
        setup(),
        vec![Command::Publish(transactional), Command::PrepareTransaction(r), Command::CommitTransaction(r)],
        vec![Command::AbortTransaction(r), Command::Tick],
        vec![
            Command::Ack {
                stream: "orders".into(),
                consumer: "c".into(),
                partition: 0,
                seq: 1,
                kind: AckKind::Applied,
            },
            Command::Ack {
                stream: "orders".into(),
                consumer: "c".into(),
                partition: 1,
                seq: 1,
                kind: AckKind::Nack { delay_ms: 100 },
            },
            Command::CommitCursor { stream: "jobs".into(), consumer: "w".into(), partition: 0, next_seq: 2 },
            Command::Acks {
                stream: "orders".into(),
                consumer: "c".into(),
                member: None,
                items: vec![
                    AckItem { partition: 0, seq: 1, kind: AckKind::Term },
                    AckItem { partition: 1, seq: 2, kind: AckKind::InProgress },
                ],
            },
        ],
        vec![
            Command::Recall { stream: "orders".into(), partition: 0, seq: 1 },
            Command::RegisterPeer { stream: "orders".into(), peer: "mirror".into() },
            Command::PeerProgress { stream: "orders".into(), peer: "mirror".into(), partition: 0, received_seq: 1 },
            Command::UnregisterPeer { stream: "orders".into(), peer: "mirror".into() },
        ],
        vec![
            Command::As {
                actor: Actor::Token(token(1)),
                command: Box::new(Command::DeleteConsumer { stream: "jobs".into(), name: "w".into() }),
            },
            Command::RevokeToken { token: token(1) },
            Command::DeletePrincipal { name: "alice".into() },
            Command::DeleteStream { name: "jobs".into() },
        ],
        vec![
            Command::Heartbeat {
                stream: "orders".into(),
                group: "g".into(),
                member: "m1".into(),
                generation: 2,
                released: vec![1],
            },
            Command::MemberFetch {
                stream: "orders".into(),
                group: "g".into(),
                member: "m2".into(),
                generation: 3,
                max: 4,
            },
            Command::MemberAck {
                stream: "orders".into(),
                group: "g".into(),
                member: "m1".into(),
                generation: 3,
                partition: 0,
                seq: 1,
                kind: AckKind::Applied,
            },
            Command::Acks {
                stream: "orders".into(),
                consumer: "g".into(),
                member: Some(GroupMember { member: "m2".into(), generation: 3 }),
                items: vec![AckItem { partition: 1, seq: 1, kind: AckKind::Nack { delay_ms: 5 } }],
            },
            Command::MemberCommit {
                stream: "orders".into(),
                group: "g".into(),
                member: "m2".into(),
                generation: 3,
                partition: 1,
                next_seq: 2,
            },
            Command::LeaveGroup { stream: "orders".into(), group: "g".into(), member: "m2".into() },
        ],
        vec![
            Command::PutCell { cell: "east".into(), addresses: vec!["east-1:7400".into(), "east-2:7400".into()] },
            Command::PutCell { cell: "west".into(), addresses: vec!["west-1:7400".into()] },
            Command::PlaceStream { stream: "orders".into(), cell: "east".into() },
            Command::MoveStream { stream: "orders".into(), to: "west".into(), epoch: 1 },
            Command::FinishMove { stream: "orders".into(), epoch: 2 },
            Command::Unplace { stream: "orders".into() },
            Command::ReceiveStream {
                stream: "jobs".into(),
                epoch: 2,
                from: "west".into(),
                config: Some(StreamConfig::with_subjects(["jobs.>"])),
            },
            Command::Ingest {
                stream: "jobs".into(),
                epoch: 2,
                messages: vec![cellog_core::IngestMessage {
                    partition: 0,
                    seq: 7,
                    request: PublishRequest::new("jobs.a", &b"copied"[..]).with_id("m-7"),
                }],
                through: vec![9],
            },
            Command::AcceptStream { stream: "jobs".into(), epoch: 2, through: vec![9] },
            Command::FenceStream { stream: "orders".into(), epoch: 3, to: "west".into() },
        ],
        vec![Command::UpdateStream {
            name: "orders".into(),
            config: StreamConfig { max_messages: Some(1), partitions: 2, ..StreamConfig::with_subjects(["orders.>"]) },
        }],
    ];
    kinds.into_iter().map(|commands| Request::new(AT.plus(10), commands)).collect()
}

// ----- the targets -----

pub fn command(input: &[u8]) {
    if let Ok(request) = postcard::from_bytes::<Request>(input) {
        apply(request.at, request.commands);
    }
}

pub fn client_requests() -> Vec<Vec<u8>> {
    let publish = v1::PublishRequest {
        subject: "orders.eu".into(),
        payload: Bytes::from_static(b"hello"),
        msg_id: Some("m-1".into()),
        key: Some(Bytes::from_static(b"key")),
        headers: [("h".to_string(), "v".to_string())].into(),
        transaction: Some(v1::ProducerRef { producer_id: 1, epoch: 0 }),
        ..v1::PublishRequest::default()
    };
    let stream = v1::CreateStreamRequest {
        name: "fresh".into(),
        config: Some(v1::StreamConfig {
            subjects: vec!["fresh.>".into()],
            partitions: 3,
            max_messages: Some(100),
            duplicate_window_ms: Some(60_000),
            ..v1::StreamConfig::default()
        }),
    };
    let consumer = v1::CreateConsumerRequest {
        stream: "orders".into(),
        name: "d".into(),
        config: Some(v1::ConsumerConfig {
            filter_subject: Some("orders.eu".into()),
            ack_wait_ms: Some(30_000),
            max_in_flight: Some(8),
            ..v1::ConsumerConfig::default()
        }),
    };
    vec![publish.encode_to_vec(), stream.encode_to_vec(), consumer.encode_to_vec()]
}

pub fn client_request(input: &[u8]) {
    let mut commands = Vec::new();
    if let Ok(request) = v1::PublishRequest::decode(input) {
        commands.push(Command::Publish(cellog_net::convert::publish(request)));
    }
    if let Ok(request) = v1::CreateStreamRequest::decode(input)
        && let Ok(config) = cellog_net::convert::stream_config(request.config)
    {
        commands.push(Command::CreateStream { name: request.name, config });
    }
    if let Ok(request) = v1::CreateConsumerRequest::decode(input)
        && let Ok(config) = cellog_net::convert::consumer_config(request.config)
    {
        commands.push(Command::CreateConsumer { stream: request.stream, name: request.name, config });
    }
    // As a node does: the checks that need no state before proposing, then the cell.
    commands.retain(|command| command.check().is_ok());
    apply(AT.plus(10), commands);
}

fn cell() -> CellIdentity {
    CellIdentity::new("fuzz")
}

fn log_id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn entries() -> Vec<Entry> {
    let mut entries: Vec<Entry> = requests()
        .into_iter()
        .enumerate()
        .map(|(n, request)| Entry { log_id: log_id(n as u64 + 1), payload: EntryPayload::Normal(request) })
        .collect();
    entries.push(Entry { log_id: log_id(entries.len() as u64 + 1), payload: EntryPayload::Blank });
    entries
}

pub fn raft_messages() -> Vec<Vec<u8>> {
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(1, 1),
        prev_log_id: Some(log_id(3)),
        entries: entries(),
        leader_commit: Some(log_id(2)),
    };
    let vote = VoteRequest::<NodeId> { vote: Vote::new(2, 2), last_log_id: Some(log_id(9)) };
    let install = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(1, 1),
        meta: SnapshotMeta {
            last_log_id: Some(log_id(9)),
            last_membership: StoredMembership::default(),
            snapshot_id: "1-9".into(),
        },
        offset: 0,
        data: prepared().snapshot(),
        done: true,
    };
    let frames = [frame_message(&cell(), &append), frame_message(&cell(), &vote), frame_message(&cell(), &install)];
    frames.into_iter().map(|frame| frame.expect("frames").payload.to_vec()).collect()
}

pub fn raft_message(input: &[u8]) {
    let forged = Frame {
        cell: "fuzz".into(),
        cell_id: None,
        crc32c: crc32c::crc32c(input),
        payload: Bytes::copy_from_slice(input),
    };
    let cell = cell();
    let _ = unframe_message::<AppendEntriesRequest<TypeConfig>>(&cell, &forged);
    let _ = unframe_message::<VoteRequest<NodeId>>(&cell, &forged);
    let _ = unframe_message::<InstallSnapshotRequest<TypeConfig>>(&cell, &forged);
}

pub fn log_record(input: &[u8]) {
    let index = 7;
    if let Ok(payload) = unframe(Space::Log, index, input) {
        let _ = cellog_raft::log_store::decode_entry(index, payload);
    }
    let framed = frame(Space::Log, index, input);
    let payload = unframe(Space::Log, index, &framed).expect("a record framed here verifies");
    if let Ok(entry) = cellog_raft::log_store::decode_entry(index, payload)
        && let EntryPayload::Normal(request) = entry.payload
    {
        apply(request.at, request.commands);
    }
}

pub fn log_records() -> Vec<Vec<u8>> {
    entries()
        .into_iter()
        .map(|mut entry| {
            entry.log_id = log_id(7);
            postcard::to_stdvec(&entry).expect("encodes")
        })
        .collect()
}

pub fn snapshot(input: &[u8]) {
    let mut fixed = input.to_vec();
    if fixed.len() >= 16 {
        let crc = crc32c::crc32c(&fixed[16..]);
        fixed[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    for bytes in [input, &fixed[..]] {
        if let Ok(cell) = Cell::restore(bytes) {
            let again = Cell::restore(&cell.snapshot()).expect("a restored cell's snapshot restores");
            assert!(again == cell, "a restored cell's snapshot restores to another state");
        }
        let _ = Cell::restore_whole(bytes);
        let _ = Cell::reencode_snapshot(bytes);
    }
}

pub fn snapshots() -> Vec<Vec<u8>> {
    let mut cell = prepared().clone();
    for request in requests() {
        for command in request.commands {
            let _ = cell.apply(request.at, command);
            cell.drain_work().for_each(drop);
        }
    }
    let fixtures = root().join("../core/tests/fixtures");
    let mut snapshots = vec![prepared().snapshot(), cell.snapshot()];
    for name in ["snapshot-v3-busy.bin", "snapshot-v4-busy.bin", "snapshot-v5-busy.bin"] {
        snapshots.push(std::fs::read(fixtures.join(name)).expect("a committed snapshot"));
    }
    snapshots
}

/// The keys envelopes are sealed with and opened by: written with the corpus, so that its envelopes open.
pub fn keys() -> &'static (CellKey, Keyring) {
    static KEYS: OnceLock<(CellKey, Keyring)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let read = |name: &str| std::fs::read(corpus_dir("envelope").join("keys").join(name)).expect("a corpus key");
        let receiver = CellKey::from_tsk(&read("receiver.tsk")).expect("the receiver's key");
        let sender = CellKey::from_tsk(&read("sender.tsk")).expect("the sender's key");
        let mut keyring = Keyring::in_memory();
        keyring.import(sender.public_armored().as_bytes(), Some(&receiver)).expect("imports");
        (receiver, keyring)
    })
}

pub fn envelope(input: &[u8]) {
    let (receiver, keyring) = keys();
    let _ = cellog_envelope::Envelope::decode(input);
    let _ = cellog_envelope::open(receiver, keyring, input, 1_000);
}

/// A target: bytes in, a panic if something is wrong.
pub type Target = fn(&[u8]);

/// Every target by the name of its corpus directory.
pub const TARGETS: [(&str, Target); 6] = [
    ("command", command),
    ("client-request", client_request),
    ("raft-message", raft_message),
    ("log-record", log_record),
    ("snapshot", snapshot),
    ("envelope", envelope),
];
