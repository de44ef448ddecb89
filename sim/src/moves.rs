//! The workload of the chaos sweep across cells (`ci/chaos --moves`): a directory and two cells, east and west, and
//! a stream moved between them again and again while producers publish to it through the directory's routes; beside
//! it, a stream of east that west mirrors, created once east holds more than a snapshot's threshold of it (so the
//! mirror's first catch-up is by snapshot); faults on the two cells meanwhile; then heal, finish any move cut short,
//! wait for the mirror to catch up, and read what the stream's owner, the mirrored stream's and the mirror's replicas
//! hold.
//!
//! The checkers of `cellog-check` then hold the owner's replicas to every acknowledgement: an acknowledged publish
//! lost across a move, acknowledged twice at two positions, or taken by a cell after its fence (an old owner writing
//! at an epoch it no longer holds) shows as a lost, duplicate or misplaced message there; and the mirror's replicas to
//! their source: a range passed over, or a message at another position, shows there.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use cellog_check::record::by_id;
use cellog_check::{Duties, Evidence};
use cellog_client::proto as v1;
use cellog_client::{Cells, ClientOptions};
use rand::Rng;

use crate::cluster::{Cluster, SimNodeId};
use crate::fault::{Fault, Step};
use crate::seeds::Concern;
use crate::workload::{Caller, Producer};

/// The cells: the directory first, then the two a stream moves between.
pub const CELLS: [(&str, u64); 3] = [("directory", 3), ("east", 3), ("west", 3)];
/// The stream that moves.
pub const STREAM: &str = "orders";
/// Its partitions.
pub const PARTITIONS: u32 = 2;
/// Producers publishing to it at once.
const PRODUCERS: usize = 2;
/// Messages each publishes.
const MESSAGES: usize = 120;
/// Moves of the stream during the run (east to west, back, ...).
const MOVES: usize = 3;
/// The stream of east that west mirrors (one partition, never moved).
pub const MIRRORED: &str = "events";
/// West's mirror of it.
pub const MIRROR: &str = "events-copy";
/// Messages published to the mirrored stream.
const EVENTS: usize = 240;
/// Messages of it east holds when the mirror is created: past the simulation's snapshot threshold, so the first
/// catch-up is by snapshot, in several chunks.
const MIRROR_AFTER: usize = 150;
/// Restarts of damaged nodes before the final reads give up.
const MAX_REPAIR_ROUNDS: usize = 4;

/// What a run found at the end.
pub struct Outcome {
    /// The cell that owns the stream at the end.
    pub owner: String,
    /// Moves finished (a move cut short and finished later counts once).
    pub moves: usize,
    /// Per stream (the moving one on its owner, the mirrored one on east, the mirror on west), what each running
    /// node of its cell holds, by message id.
    pub held: BTreeMap<String, BTreeMap<SimNodeId, cellog_check::Stored>>,
    /// Why the owner's replicas could not be read or did not converge, if so.
    pub liveness: Option<String>,
}

/// Whether a fault of a one-cell schedule applies across cells: a membership change and an isolated leader act on
/// the first cell (the directory here, the deployment's one fixed point; its own faults are the subject of
/// `sim/tests/cells.rs`), and are left out.
pub fn applies(step: &Step) -> bool {
    !matches!(step.fault, Fault::Membership | Fault::IsolateLeader)
}

fn message(producer: usize, index: usize) -> v1::PublishRequest {
    let id = format!("p{producer}-{index}");
    v1::PublishRequest {
        subject: format!("orders.{}", index % 5),
        payload: Bytes::from(id.clone()),
        msg_id: Some(id),
        ..v1::PublishRequest::default()
    }
}

/// Waits for every cell of [`CELLS`] to lead, records east and west in the directory, creates [`STREAM`] on east
/// and places it there.
pub async fn deploy(cluster: &Cluster) {
    for (cell, _) in CELLS {
        cluster.wait_leader_in(cell).await;
    }
    let (directory, east) = (cluster.client_in("directory"), cluster.client_in("east"));
    let addresses: Vec<(&str, Vec<String>)> =
        ["east", "west"].into_iter().map(|cell| (cell, cluster.addresses_in(cell))).collect();
    cluster
        .on_client(async move {
            for (cell, addresses) in addresses {
                directory.put_cell(cell, addresses).await.expect("cell recorded");
            }
            let config = v1::StreamConfig {
                subjects: vec!["orders.>".to_string()],
                partitions: PARTITIONS,
                duplicate_window_ms: Some(24 * 3_600_000),
                ..v1::StreamConfig::default()
            };
            east.create_stream(STREAM, config).await.expect("stream created");
            directory.place_stream(STREAM, "east").await.expect("stream placed");
        })
        .await;
}

/// Moves the stream to `to`, again after a pause while it fails (a cell cut off, a leader gone), until it is done
/// or a minute has passed.
async fn move_to(cells: &Cells, to: &str) -> bool {
    for _ in 0..60 {
        match cells.move_stream(STREAM, to).await {
            Ok(moved) => {
                let note = format!("{STREAM} to {to} epoch={} copied={}", moved.epoch, moved.copied);
                crate::trace::harness(None, "moved", &note);
                return true;
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    false
}

/// Runs the workload with the faults of `schedule` on the cells of [`CELLS`], then heals, finishes the last move,
/// and reads the stream's owner.
pub async fn run(cluster: &mut Cluster, schedule: &[Step]) -> Outcome {
    let mut workload = cluster.seeds().rng(Concern::Workload);
    deploy(cluster).await;
    let directory = cluster.client_in("directory");
    let options = ClientOptions { retry_for: Duration::from_secs(5), ..ClientOptions::default() };
    let mut publishing = Vec::new();
    for producer in 0..PRODUCERS {
        let caller = Caller { client: cluster.client_in("east"), history: cluster.history().clone() };
        let process = format!("producer-{producer}");
        let (producer_log, cells) = (Producer::new(caller, &process), Cells::new(directory.clone(), options.clone()));
        let pause = workload.gen_range(20..80);
        publishing.push(cluster.spawn_on_client(async move {
            for index in 0..MESSAGES {
                // Each message until it is acknowledged or refused for good; its id makes a repeat safe.
                for _ in 0..20 {
                    match producer_log.publish_routed(&cells, STREAM, message(producer, index)).await {
                        Ok(_) => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }
    publishing.push(mirrored(cluster, &directory, &options).await);
    let waits: Vec<u64> = (0..MOVES).map(|_| workload.gen_range(500..2_500)).collect();
    let mover = Cells::new(directory.clone(), options.clone());
    let moving = cluster.spawn_on_client(async move {
        let mut moves = 0;
        for (round, wait) in waits.into_iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let to = if round % 2 == 0 { "west" } else { "east" };
            if !move_to(&mover, to).await {
                break;
            }
            moves += 1;
        }
        moves
    });
    cluster.run_schedule(schedule).await;
    cluster.heal_all();
    let mut moves = cluster
        .finish_workload("the workload", async {
            for producing in publishing {
                producing.await.expect("a producer finished");
            }
            moving.await.expect("the mover finished")
        })
        .await;
    // A move cut short by the faults is finished now that everything is healed.
    let (finisher, location) = (Cells::new(directory.clone(), ClientOptions::default()), directory.clone());
    let (owner, finished) = cluster
        .on_client(async move {
            let placement = location.locate_stream(STREAM).await.ok().and_then(|location| location.placement);
            let owner = placement.as_ref().map(|placement| placement.cell.clone()).unwrap_or_default();
            let unfinished = placement.is_some_and(|placement| placement.moving_from.is_some());
            let finished = unfinished && move_to(&finisher, &owner).await;
            (owner, finished)
        })
        .await;
    moves += usize::from(finished);
    let mirror_behind = mirror_caught_up(cluster).await.err();
    // As in the mixed workload: a node that found a damaged body is restarted (as an operator does on
    // `cellog_bodies_unreadable`) and read again once it has repaired.
    let mut round = 0;
    let read = [(owner.as_str(), STREAM, PARTITIONS), ("east", MIRRORED, 1), ("west", MIRROR, 1)];
    let (held, liveness) = loop {
        round += 1;
        cluster.restart_damaged();
        let mut liveness: Vec<String> = mirror_behind.iter().cloned().collect();
        for cell in [owner.as_str(), "east", "west"] {
            if let Err(why) = cluster.try_converge_in(cell).await {
                liveness.push(why);
            }
        }
        let (mut held, mut damaged) = (BTreeMap::new(), Vec::new());
        for (cell, stream, partitions) in read {
            let on_cell: &mut BTreeMap<SimNodeId, cellog_check::Stored> = held.entry(stream.to_string()).or_default();
            for node in cluster.running_in(cell) {
                match cluster.try_messages_on(node, stream, partitions).await {
                    Ok(messages) => {
                        on_cell.insert(node, by_id(messages));
                    }
                    Err(error) if error.reason() == Some("BODY_UNREADABLE") => damaged.push(node),
                    Err(error) => liveness.push(format!("node {node} could not be read in {stream}: {error}")),
                }
            }
        }
        damaged.sort_unstable();
        damaged.dedup();
        if damaged.is_empty() || round == MAX_REPAIR_ROUNDS {
            if !damaged.is_empty() {
                liveness.push(format!("nodes {damaged:?} still hold damaged bodies after {round} restarts"));
            }
            liveness.extend(cluster.node_panics().into_iter().map(|line| format!("a node panicked: {line}")));
            break (held, (!liveness.is_empty()).then(|| liveness.join("; ")));
        }
    };
    Outcome { owner, moves, held, liveness }
}

/// The run's evidence: the history and what the nodes hold (the streams are neither consumed nor trimmed; the mirror
/// follows the mirrored stream).
pub fn evidence(cluster: &Cluster, outcome: &Outcome) -> Evidence {
    Evidence {
        operations: cluster.history().operations(),
        held: outcome.held.clone(),
        states: BTreeMap::new(),
        samples: Vec::new(),
        duties: Duties { mirrors: BTreeMap::from([(MIRROR.to_string(), MIRRORED.to_string())]), ..Duties::default() },
    }
}

/// Creates [`MIRRORED`] on east (placed there, so that its producer routes through the directory) and starts its
/// producer, which has west create [`MIRROR`] once east holds [`MIRROR_AFTER`] of its messages.
async fn mirrored(
    cluster: &Cluster,
    directory: &cellog_client::Client,
    options: &ClientOptions,
) -> madsim::task::JoinHandle<()> {
    let (east, west, placing) = (cluster.client_in("east"), cluster.client_in("west"), directory.clone());
    let config = v1::StreamConfig {
        subjects: vec![format!("{MIRRORED}.>")],
        partitions: 1,
        duplicate_window_ms: Some(24 * 3_600_000),
        ..v1::StreamConfig::default()
    };
    let creating = config.clone();
    cluster
        .on_client(async move {
            east.create_stream(MIRRORED, creating).await.expect("stream created");
            placing.place_stream(MIRRORED, "east").await.expect("stream placed");
        })
        .await;
    let caller = Caller { client: cluster.client_in("east"), history: cluster.history().clone() };
    let (producer, cells) = (Producer::new(caller, "events-producer"), Cells::new(directory.clone(), options.clone()));
    let addresses = cluster.addresses_in("east");
    cluster.spawn_on_client(async move {
        for index in 0..EVENTS {
            if index == MIRROR_AFTER {
                for _ in 0..60 {
                    match west.create_mirror(MIRROR, config.clone(), "east", MIRRORED, addresses.clone()).await {
                        Ok(_) => break,
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                }
            }
            let id = format!("e-{index}");
            let request = v1::PublishRequest {
                subject: format!("{MIRRORED}.{}", index % 3),
                payload: Bytes::from(id.clone()),
                msg_id: Some(id),
                ..v1::PublishRequest::default()
            };
            for _ in 0..20 {
                match producer.publish_routed(&cells, MIRRORED, request.clone()).await {
                    Ok(_) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Waits (at most a minute) until west's mirror ends where east's stream does; `Err` says how far apart they were.
async fn mirror_caught_up(cluster: &Cluster) -> Result<(), String> {
    let (east, west) = (cluster.client_in("east"), cluster.client_in("west"));
    cluster
        .on_client(async move {
            let mut last = String::new();
            for _ in 0..120 {
                let source = east.stream_info(MIRRORED).await.map(|info| info.partitions);
                let mirror = west.list_mirrors().await.map(|mirrors| mirrors.into_iter().find(|m| m.name == MIRROR));
                match (source, mirror) {
                    (Ok(source), Ok(Some(mirror))) => {
                        let source: Vec<u64> = source.iter().map(|p| p.high_watermark).collect();
                        if source == mirror.last_seqs {
                            return Ok(());
                        }
                        last = format!("the mirror ends at {:?}, its source at {source:?}", mirror.last_seqs);
                    }
                    (Ok(_), Ok(None)) => last = "west has no mirror".to_string(),
                    (Err(error), _) | (_, Err(error)) => last = error.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(format!("the mirror did not catch up in a minute: {last}"))
        })
        .await
}
