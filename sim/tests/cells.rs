//! Many cells in deterministic simulation: a directory cell and two cells a stream moves between, under load and
//! faults. Every acknowledged publish must be on the stream's owner at the end, exactly once, at the position its
//! acknowledgement named, whichever cell acknowledged it; the old owner takes no write after its fence; a move cut
//! short is finished by running it again.

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
