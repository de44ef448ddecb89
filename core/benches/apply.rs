//! Throughput of `Cell::apply`: publishes of 256-byte bodies (plain, with message ids, keyed over partitions, routed
//! among a thousand streams) and
//! consume-and-ack with fetches of 256; and a snapshot of a cell holding 200 000 messages with ids, encoded or copied.
//! Commands are built before the clock starts, as a replica receives them
//! decoded from the log; draining effects after every apply is counted, and so is keeping the bodies they store in
//! memory, since every host does both.
//!
//! Run with `cargo bench -p cellog-core --bench apply`.
#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall-clock time")]

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellog_core::{
    AckKind, Cell, Command, ConsumerConfig, MemoryBodies, Millis, Outcome, PublishRequest, StreamConfig,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const BODY_BYTES: usize = 256;
/// Messages per fresh cell, so memory stays bounded however many iterations criterion asks for.
const CHUNK: u64 = 200_000;

fn cell_with_stream(partitions: u32) -> Cell {
    let mut cell = Cell::new();
    let config = StreamConfig { partitions, ..StreamConfig::with_subjects(["bench.>"]) };
    cell.apply(Millis(0), Command::CreateStream { name: "bench".to_string(), config }).expect("stream");
    cell
}

/// What a host does after every apply: takes the effects and keeps the bodies they store.
fn drain(cell: &mut Cell, bodies: &mut MemoryBodies) {
    cell.drain_work().for_each(|work| bodies.apply(&work));
}

/// A cell of `n` streams, each claiming 64 filters (`s<i>.f<j>.>`); publishes to `s<n-1>.f63.x` go to the last one,
/// which a scan of every stream's filters would reach last.
fn cell_with_streams(n: u32) -> Cell {
    let mut cell = Cell::new();
    for i in 0..n {
        let config = StreamConfig::with_subjects((0..64).map(|j| format!("s{i}.f{j}.>")));
        cell.apply(Millis(0), Command::CreateStream { name: format!("s{i}"), config }).expect("stream");
    }
    cell
}

/// Builds `n` publish commands to `subject`; `shape` fills in id and key.
fn publishes_to(subject: &str, n: u64, shape: impl Fn(u64, PublishRequest) -> PublishRequest) -> Vec<Command> {
    let body = Bytes::from(vec![b'x'; BODY_BYTES]);
    (0..n).map(|i| Command::Publish(shape(i, PublishRequest::new(subject, body.clone())))).collect()
}

/// Builds `n` publish commands to the bench stream; `shape` fills in id and key.
fn publishes(n: u64, shape: impl Fn(u64, PublishRequest) -> PublishRequest) -> Vec<Command> {
    publishes_to("bench.orders", n, shape)
}

/// Applies commands to fresh cells in chunks and returns the time spent in `apply` and draining effects.
fn run_publishes(
    iters: u64,
    partitions: u32,
    shape: &(impl Fn(u64, PublishRequest) -> PublishRequest + Copy),
) -> Duration {
    run_publishes_in(iters, &|| cell_with_stream(partitions), "bench.orders", shape)
}

/// Applies publishes to `subject` to cells made by `cell`, in chunks, and returns the time spent in `apply` and
/// draining effects.
fn run_publishes_in(
    iters: u64,
    cell: &impl Fn() -> Cell,
    subject: &str,
    shape: &(impl Fn(u64, PublishRequest) -> PublishRequest + Copy),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut remaining = iters;
    while remaining > 0 {
        let n = remaining.min(CHUNK);
        let mut cell = cell();
        let mut bodies = MemoryBodies::default();
        let commands = publishes_to(subject, n, shape);
        let start = Instant::now();
        for (i, command) in commands.into_iter().enumerate() {
            // A thousand commands per millisecond of cell time.
            black_box(cell.apply(Millis(1 + i as u64 / 1000), command)).expect("publish");
            drain(&mut cell, &mut bodies);
        }
        total += start.elapsed();
        remaining -= n;
    }
    total
}

fn publish(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(1));
    group.bench_function("publish_256B", |b| b.iter_custom(|iters| run_publishes(iters, 1, &|_, r| r)));
    group.bench_function("publish_256B_with_msg_id", |b| {
        b.iter_custom(|iters| run_publishes(iters, 1, &|i, r| r.with_id(format!("msg-{i}"))))
    });
    group.bench_function("publish_256B_keyed_8_partitions", |b| {
        b.iter_custom(|iters| {
            run_publishes(iters, 8, &|i, r| PublishRequest {
                key: Some(Bytes::from((i % 64).to_le_bytes().to_vec())),
                ..r
            })
        })
    });
    // Routing among a thousand streams of 64 filters each, to the one a scan would reach last.
    group.bench_function("publish_256B_1000_streams", |b| {
        let template = cell_with_streams(1000);
        b.iter_custom(|iters| run_publishes_in(iters, &|| template.clone(), "s999.f63.x", &|_, r| r))
    });
    // A long-lived stream at its message limit: every publish also evicts the oldest message, and memory is reused
    // rather than freshly faulted in.
    group.bench_function("publish_256B_at_limit_evicting", |b| {
        let mut cell = Cell::new();
        let config = StreamConfig { max_messages: Some(100_000), ..StreamConfig::with_subjects(["bench.>"]) };
        cell.apply(Millis(0), Command::CreateStream { name: "bench".to_string(), config }).expect("stream");
        let mut bodies = MemoryBodies::default();
        let mut at = 1u64;
        for command in publishes(100_000, |_, r| r) {
            cell.apply(Millis(at), command).expect("publish");
            drain(&mut cell, &mut bodies);
        }
        b.iter_custom(|iters| {
            let commands = publishes(iters, |_, r| r);
            let start = Instant::now();
            for command in commands {
                at += 1;
                black_box(cell.apply(Millis(at / 1000), command)).expect("publish");
                drain(&mut cell, &mut bodies);
            }
            start.elapsed()
        })
    });
    group.finish();
}

/// Fetch 256, ack each: the time per acknowledged message (one fetch command per 256 acks).
fn consume_and_ack(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(1));
    group.bench_function("fetch256_and_ack", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut remaining = iters;
            while remaining > 0 {
                let n = remaining.min(CHUNK);
                let mut cell = cell_with_stream(1);
                let mut bodies = MemoryBodies::default();
                for (i, command) in publishes(n, |_, r| r).into_iter().enumerate() {
                    cell.apply(Millis(1 + i as u64 / 1000), command).expect("publish");
                    drain(&mut cell, &mut bodies);
                }
                let config = ConsumerConfig { max_in_flight: 1024, ..ConsumerConfig::default() };
                cell.apply(
                    Millis(1_000),
                    Command::CreateConsumer { stream: "bench".to_string(), name: "c".to_string(), config },
                )
                .expect("consumer");
                drain(&mut cell, &mut bodies);
                let at = Millis(1_000);
                let start = Instant::now();
                let mut acked = 0;
                while acked < n {
                    let fetch = Command::Fetch {
                        stream: "bench".to_string(),
                        consumer: "c".to_string(),
                        member: "m".to_string(),
                        max: 256,
                    };
                    let Ok(Outcome::Fetched(deliveries)) = cell.apply(at, fetch) else { panic!("fetch") };
                    drain(&mut cell, &mut bodies);
                    for delivery in deliveries {
                        let ack = Command::Ack {
                            stream: "bench".to_string(),
                            consumer: "c".to_string(),
                            partition: delivery.record.partition,
                            seq: delivery.record.seq,
                            kind: AckKind::Applied,
                        };
                        black_box(cell.apply(at, ack)).expect("ack");
                        drain(&mut cell, &mut bodies);
                        acked += 1;
                    }
                }
                total += start.elapsed();
                remaining -= n;
            }
            total
        })
    });
    group.finish();
}

/// A snapshot of a cell of [`CHUNK`] messages, with ids and without: what a host encodes while applying waits. And
/// copying the cell with ids, the alternative of encoding a copy after letting the replica go (measured at a quarter
/// of the encoding's time: the wait would shrink by three quarters for a quarter more CPU). Per message.
fn snapshot(c: &mut Criterion) {
    let mut bodies = MemoryBodies::default();
    let mut filled = |shape: &dyn Fn(u64, PublishRequest) -> PublishRequest| {
        let mut cell = cell_with_stream(1);
        for (i, command) in publishes(CHUNK, shape).into_iter().enumerate() {
            cell.apply(Millis(1 + i as u64 / 1000), command).expect("publish");
            drain(&mut cell, &mut bodies);
        }
        cell
    };
    let with_ids = filled(&|i, r| r.with_id(format!("msg-{i}")));
    let plain = filled(&|_, r| r);
    let mut group = c.benchmark_group("snapshot");
    group.throughput(Throughput::Elements(CHUNK));
    group.sample_size(10);
    group.bench_function("encode_200k", |b| b.iter(|| black_box(plain.snapshot())));
    group.bench_function("encode_200k_with_msg_id", |b| b.iter(|| black_box(with_ids.snapshot())));
    group.bench_function("clone_200k_with_msg_id", |b| b.iter(|| black_box(with_ids.clone())));
    group.finish();
}

criterion_group!(benches, publish, consume_and_ack, snapshot);
criterion_main!(benches);
