//! Many cells in deterministic simulation: a directory cell and two cells a stream moves between, under load and
//! faults. Every acknowledged publish must be on the stream's owner at the end, exactly once, at the position its
//! acknowledgement named, whichever cell acknowledged it; the old owner takes no write after its fence; a move cut
//! short is finished by running it again.
//!
//! And a mirror of east's stream on west, across partitions that heal and leader crashes on both sides: it catches
//! up by snapshot after a long cut and incrementally after a short one, uses east again as soon as the link is back,
//! follows east's recalls, and ends holding exactly what east holds, where east holds it.

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Cells, ClientOptions};
use cellog_sim::{Cluster, moves};

const STREAM: &str = moves::STREAM;
const PARTITIONS: u32 = moves::PARTITIONS;

/// A directory, `east` and `west`, three nodes each; `orders` created on `east` and placed there.
async fn deployment() -> Cluster {
    let cluster = Cluster::with_cells(&moves::CELLS, cellog_net::RaftTiming::default(), false);
    moves::deploy(&cluster).await;
    cluster
}

fn cells_of(cluster: &Cluster) -> Cells {
    Cells::new(cluster.client_in("directory"), ClientOptions::default())
}

fn message(index: usize) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: format!("orders.{}", index % 5),
        payload: Bytes::from(format!("m-{index}")),
        msg_id: Some(format!("m-{index}")),
        ..v1::PublishRequest::default()
    }
}

/// Publishes `range` one by one through the deployment, each until it is acknowledged; answers each id's position.
async fn publish(cells: Cells, range: std::ops::Range<usize>) -> BTreeMap<String, (u32, u64)> {
    let mut acked = BTreeMap::new();
    for index in range {
        let ack = loop {
            match cells.publish(STREAM, message(index)).await {
                Ok(ack) => break ack,
                // Unknown or refused while the move holds writes back: the id makes a repeat safe.
                Err(error) => {
                    assert!(
                        error.outcome_unknown() || matches!(error.reason(), Some("STREAM_MOVING" | "MOVED")),
                        "m-{index}: {error}"
                    );
                    madsim::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        assert_eq!(ack.stream, STREAM);
        acked.insert(format!("m-{index}"), (ack.partition, ack.seq));
    }
    acked
}

/// What `cell` holds of the stream: each message id with its positions (more than one is a duplicate).
async fn held(cluster: &Cluster, cell: &str) -> BTreeMap<String, Vec<(u32, u64)>> {
    let client = cluster.client_in(cell);
    cluster
        .on_client(async move {
            let mut held: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
            for partition in 0..PARTITIONS {
                let mut from = 1;
                loop {
                    let read = client.read(STREAM, partition, from, 1000, false).await.expect("a read").messages;
                    let Some(last) = read.last().map(|m| m.seq) else { break };
                    for m in read {
                        held.entry(m.msg_id.clone().unwrap_or_default()).or_default().push((m.partition, m.seq));
                    }
                    from = last + 1;
                }
            }
            held
        })
        .await
}

/// Every acknowledged id is on `west` exactly once, where its acknowledgement said; nothing else is there; `east`
/// refuses writes naming `west`, and the directory records the move done.
async fn check_moved(cluster: &Cluster, acked: &BTreeMap<String, (u32, u64)>) {
    let west = held(cluster, "west").await;
    for (id, position) in acked {
        assert_eq!(west.get(id), Some(&vec![*position]), "{id} acknowledged at {position:?}");
    }
    for (id, positions) in &west {
        assert!(acked.contains_key(id) && positions.len() == 1, "{id} at {positions:?} was never acknowledged");
    }
    let (east, directory) = (cluster.client_in("east"), cluster.client_in("directory"));
    cluster
        .on_client(async move {
            let refused = east.publish(message(1_000_000)).await.expect_err("east no longer owns the stream");
            assert_eq!(refused.reason(), Some("MOVED"), "{refused}");
            let placement = directory.locate_stream(STREAM).await.expect("placed").placement.expect("a placement");
            assert_eq!((placement.cell.as_str(), placement.epoch, placement.moving_from), ("west", 2, None));
        })
        .await;
}

#[madsim::test]
async fn a_stream_moves_between_cells_under_load_with_nothing_lost_or_duplicated() {
    let cluster = deployment().await;
    let cells = cells_of(&cluster);
    let early = cluster.on_client(publish(cells.clone(), 0..50)).await;
    // A client that learned the route before the move is sent on by the old owner's MOVED.
    let stale = cells_of(&cluster);
    let rerouted = cluster.on_client(publish(stale.clone(), 50..51)).await;
    let load = cluster.spawn_on_client(publish(cells.clone(), 51..400));
    let mover = cells.clone();
    let moved = cluster
        .on_client(async move {
            madsim::time::sleep(Duration::from_millis(500)).await;
            mover.move_stream(STREAM, "west").await.expect("moved")
        })
        .await;
    assert_eq!((moved.epoch, moved.from.as_deref()), (2, Some("east")));
    assert!(moved.copied > 50, "{moved:?}");
    let mut acked = load.await.expect("the load ran");
    let after = acked.values().filter(|(partition, seq)| *seq > moved.through[*partition as usize]).count();
    assert!(0 < after && after < acked.len(), "the load ran across the move: {after} of {} after it", acked.len());
    acked.extend(early);
    acked.extend(rerouted);
    acked.extend(cluster.on_client(publish(stale, 400..410)).await);
    check_moved(&cluster, &acked).await;
}

#[madsim::test]
async fn a_move_cut_short_by_the_directory_leaders_crash_is_finished_by_running_it_again() {
    let mut cluster = deployment().await;
    let cells = cells_of(&cluster);
    let load = cluster.spawn_on_client(publish(cells.clone(), 0..300));
    madsim::time::sleep(Duration::from_millis(300)).await;
    let mover = cells.clone();
    let first = cluster.spawn_on_client(async move { mover.move_stream(STREAM, "west").await });
    madsim::time::sleep(Duration::from_millis(20)).await;
    let leader = cluster.wait_leader_in("directory").await;
    cluster.node(leader).crash();
    // However far the first attempt got, running the move again takes it up where it stopped.
    let _ = first.await;
    madsim::time::sleep(Duration::from_secs(2)).await;
    cluster.node(leader).restart();
    let mover = cells.clone();
    let moved = cluster.on_client(async move { mover.move_stream(STREAM, "west").await }).await;
    match moved {
        Ok(moved) => assert_eq!(moved.epoch, 2),
        Err(error) => panic!("the move was not finished: {error}"),
    }
    let acked = load.await.expect("the load ran");
    check_moved(&cluster, &acked).await;
}

/// A stream a cell does not hold is neither placed on it nor moved from it: refused naming that cell, before the
/// directory records anything, so that no placement or move is left that could never be finished.
#[madsim::test]
async fn a_stream_a_cell_does_not_hold_is_neither_placed_nor_moved() {
    let cluster = deployment().await;
    let cells = cells_of(&cluster);
    let refusals = cluster
        .on_client(async move {
            let placed = cells.place(STREAM, "west").await.expect_err("west holds no orders");
            // Recorded straight in the directory, which cannot know: a placement on a cell without the stream.
            cells.directory().place_stream("ghost", "east").await.expect("placed");
            let moved = cells.move_stream("ghost", "west").await.expect_err("east holds no ghost");
            let orders = cells.directory().locate_stream(STREAM).await.expect("located").placement;
            let ghost = cells.directory().locate_stream("ghost").await.expect("located").placement;
            (placed, moved, orders, ghost)
        })
        .await;
    let (placed, moved, orders, ghost) = refusals;
    for (error, cell, stream) in [(&placed, "west", STREAM), (&moved, "east", "ghost")] {
        assert_eq!(error.reason(), Some("STREAM_NOT_FOUND"), "{error}");
        let detail = error.detail().expect("a detail");
        assert_eq!(detail.cell, cell, "{error}");
        assert!(detail.message.contains(&format!("cell {cell:?} holds no stream {stream:?}")), "{error}");
    }
    let at = |placement: Option<v1::Placement>| placement.map(|p| (p.cell, p.epoch, p.moving_from));
    assert_eq!(at(orders), Some(("east".to_string(), 1, None)), "orders stays where it was");
    assert_eq!(at(ghost), Some(("east".to_string(), 1, None)), "no move of ghost is recorded");
}

#[madsim::test]
async fn an_old_owner_cut_off_during_a_move_holds_it_back_and_takes_no_write_after_its_fence() {
    let mut cluster = deployment().await;
    // A client that learned the route to east before the move, and keeps it.
    let stale = cells_of(&cluster);
    let mut acked = cluster.on_client(publish(stale.clone(), 0..40)).await;
    // East is cut off: its fence cannot be proposed (nor its config read), so the move cannot finish, and west takes
    // no write meanwhile.
    let east = cluster.ids_in("east");
    for &id in &east {
        cluster.node(id).pause();
    }
    let mover = cells_of(&cluster);
    let cut_short = cluster.on_client(async move { mover.move_stream(STREAM, "west").await }).await;
    assert!(cut_short.is_err(), "a move cannot finish without fencing the old owner: {cut_short:?}");
    let west = cluster.client_in("west");
    let refused = cluster.on_client(async move { west.publish(message(999)).await }).await;
    let refused = refused.expect_err("west takes no write before east is fenced");
    assert!(matches!(refused.reason(), Some("STREAM_MOVING" | "NO_STREAM_FOR_SUBJECT")), "{refused}");
    for &id in &east {
        cluster.node(id).resume();
    }
    // Back, east still owns the stream (nothing fenced it) and takes writes at the epoch it holds; the move run
    // again fences it and carries them over.
    acked.extend(cluster.on_client(publish(stale.clone(), 40..45)).await);
    let mover = cells_of(&cluster);
    let moved = cluster.on_client(async move { mover.move_stream(STREAM, "west").await }).await.expect("moved");
    assert_eq!((moved.epoch, moved.from.as_deref()), (2, Some("east")));
    acked.extend(cluster.on_client(publish(stale, 45..60)).await);
    check_moved(&cluster, &acked).await;
}

const MIRROR: &str = "orders-copy";

/// Each partition's messages that are not recalled, by sequence: id and payload.
type Held = Vec<BTreeMap<u64, (Option<String>, Bytes)>>;

/// What `stream` on `cell` holds, recalled messages left out.
async fn contents(cluster: &Cluster, cell: &str, stream: &str) -> Held {
    let client = cluster.client_in(cell);
    let stream = stream.to_string();
    cluster
        .on_client(async move {
            let mut held = vec![BTreeMap::new(); PARTITIONS as usize];
            for (partition, messages) in held.iter_mut().enumerate() {
                let mut from = 1;
                loop {
                    let read = client.read(&stream, partition as u32, from, 1000, false).await.expect("a read");
                    let Some(last) = read.messages.last().map(|m| m.seq) else { break };
                    for m in read.messages.into_iter().filter(|m| m.recalled_at_ms.is_none()) {
                        messages.insert(m.seq, (m.msg_id, m.payload));
                    }
                    from = last + 1;
                }
            }
            held
        })
        .await
}

/// The mirror's status on west, as its leader reports it.
async fn mirror_status(cluster: &Cluster) -> v1::MirrorStatus {
    let west = cluster.client_in("west");
    cluster
        .on_client(async move {
            let mirrors = west.list_mirrors().await.expect("west lists its mirrors");
            mirrors.into_iter().find(|m| m.name == MIRROR).expect("the mirror is listed")
        })
        .await
}

/// Waits until the mirror holds every position east's stream holds, at most `within`; answers how long it took.
#[allow(clippy::disallowed_methods, reason = "simulated time: how long the catch-up took is what the test is about")]
async fn caught_up(cluster: &Cluster, within: Duration) -> Duration {
    let started = madsim::time::Instant::now();
    let east = cluster.client_in("east");
    let target: Vec<u64> = cluster
        .on_client(async move {
            let info = east.stream_info(STREAM).await.expect("east's stream");
            info.partitions.iter().map(|p| p.high_watermark).collect()
        })
        .await;
    loop {
        let status = mirror_status(cluster).await;
        if status.last_seqs == target {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "the mirror is not caught up after {within:?}: {status:?}");
        madsim::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn recall(cluster: &Cluster, partition: u32, seq: u64) {
    let east = cluster.client_in("east");
    cluster.on_client(async move { east.recall(STREAM, partition, seq).await.expect("recalled") }).await;
}

/// A mirror of east's stream on west (see the module's documentation).
#[madsim::test]
async fn a_mirror_across_a_partition_that_heals_catches_up_by_snapshot_and_incrementally() {
    let mut cluster = deployment().await;
    let (east, west) = (cluster.client_in("east"), cluster.client_in("west"));
    let addresses = cluster.addresses_in("east");
    cluster
        .on_client(async move {
            let config = east.stream_info(STREAM).await.expect("east's stream").config.expect("a config");
            assert!(west.create_mirror(MIRROR, config, "east", STREAM, addresses).await.expect("a mirror"));
            let refused = west.publish(message(0)).await.expect_err("a mirror takes no writes");
            assert_eq!(refused.reason(), Some("MIRROR"), "{refused}");
        })
        .await;
    let cells = cells_of(&cluster);
    cluster.on_client(publish(cells.clone(), 0..30)).await;
    caught_up(&cluster, Duration::from_secs(10)).await;
    let status = mirror_status(&cluster).await;
    assert_eq!((status.snapshots, status.peer_state()), (0, v1::MirrorPeerState::MirrorPeerUp), "{status:?}");
    assert!(status.increments > 0, "{status:?}");
    recall(&cluster, 0, 2).await;

    // West cut off from east for twenty seconds while east takes far more than the snapshot threshold.
    let (east_ids, west_ids) = (cluster.ids_in("east"), cluster.ids_in("west"));
    cluster.partition(&east_ids, &west_ids);
    cluster.on_client(publish(cells.clone(), 30..330)).await;
    recall(&cluster, 1, 40).await;
    madsim::time::sleep(Duration::from_secs(20)).await;
    let down = mirror_status(&cluster).await;
    assert_eq!(down.peer_state(), v1::MirrorPeerState::MirrorPeerDown, "{down:?}");
    assert!(!down.last_error.is_empty() && down.errors > 0, "{down:?}");
    cluster.heal();
    // The backoff reached seconds meanwhile; the probe sees the link back and the catch-up starts at once.
    let took = caught_up(&cluster, Duration::from_secs(30)).await;
    assert!(took < Duration::from_secs(3), "caught up {took:?} after the heal");
    let status = mirror_status(&cluster).await;
    assert_eq!((status.snapshots, status.peer_state()), (1, v1::MirrorPeerState::MirrorPeerUp), "{status:?}");
    assert_eq!(status.recalls_applied, 2, "both recalls reached the mirror");

    // A short cut: the lag stays under the threshold, and the catch-up is incremental.
    let increments = status.increments;
    cluster.partition(&east_ids, &west_ids);
    cluster.on_client(publish(cells.clone(), 330..360)).await;
    madsim::time::sleep(Duration::from_secs(2)).await;
    cluster.heal();
    caught_up(&cluster, Duration::from_secs(10)).await;
    let status = mirror_status(&cluster).await;
    assert_eq!(status.snapshots, 1, "{status:?}");
    assert!(status.increments > increments, "{status:?}");

    // West's leader crashes: the next one takes the mirror up where the cell's state says it ends.
    let leader = cluster.wait_leader_in("west").await;
    cluster.node(leader).crash();
    cluster.on_client(publish(cells.clone(), 360..380)).await;
    recall(&cluster, 0, 3).await;
    caught_up(&cluster, Duration::from_secs(20)).await;
    cluster.node(leader).restart();
    // East's leader crashes: the mirror's reads and reports follow the next one.
    let leader = cluster.wait_leader_in("east").await;
    cluster.node(leader).crash();
    cluster.on_client(publish(cells.clone(), 380..400)).await;
    caught_up(&cluster, Duration::from_secs(20)).await;
    cluster.node(leader).restart();

    let (source, mirror) = (contents(&cluster, "east", STREAM).await, contents(&cluster, "west", MIRROR).await);
    assert_eq!(mirror, source, "the mirror holds what its source holds, at the same positions");
    assert_eq!(source.iter().map(BTreeMap::len).sum::<usize>(), 397);
    let east = cluster.client_in("east");
    let peers = cluster.on_client(async move { east.stream_info(STREAM).await.expect("east's stream").peers }).await;
    let last: Vec<u64> = source.iter().map(|p| p.keys().last().copied().unwrap_or(0)).collect();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].received, last, "east knows what the mirror received");

    // East's stream deleted and made again: a stream the mirror does not follow. It copies nothing of it, and says
    // why, until it is made again itself.
    let east = cluster.client_in("east");
    cluster
        .on_client(async move {
            let config = east.stream_info(STREAM).await.expect("east's stream").config.expect("a config");
            east.delete_stream(STREAM).await.expect("deleted");
            east.create_stream(STREAM, config).await.expect("made again");
            for index in 1_000..1_010 {
                east.publish(message(index)).await.expect("published");
            }
        })
        .await;
    madsim::time::sleep(Duration::from_secs(5)).await;
    let status = mirror_status(&cluster).await;
    assert!(status.last_error.contains("no longer has this mirror registered"), "{status:?}");
    assert_eq!(contents(&cluster, "west", MIRROR).await, mirror, "nothing of the new stream copied");
}
