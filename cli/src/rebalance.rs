//! `cellog bench rebalance`: how long a consumer group takes to absorb a new member, eager against cooperative.
//!
//! For each strategy, on a stream of its own: MEMBERS members consume (fetch, ack) while messages keep arriving; once
//! the group is settled a member joins, and the group is watched until it is settled again. Reported: the time from
//! the join to settled, and how much consumption paused meanwhile: a partition is paused while no member may fetch
//! from it (being revoked, or waiting for its new owner), counted in partition-seconds and at its worst.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cellog_client::Client;
use cellog_client::group::{GroupMember, MemberOptions, Quiet};
use cellog_client::proto as v1;
use tokio::time::Instant;

use crate::Connect;
use crate::commands::client;

#[derive(clap::Args, Clone, Debug)]
pub struct RebalanceArgs {
    /// Partitions of the stream.
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Members before the one that joins.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// How often each member heartbeats, in milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Messages published a second meanwhile.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    #[command(flatten)]
    connect: Connect,
}

/// What one strategy measured.
struct Measured {
    strategy: &'static str,
    settle: Duration,
    paused_partition_seconds: f64,
    most_paused: usize,
    generations: u64,
}

pub async fn run(args: RebalanceArgs) -> anyhow::Result<()> {
    let client = client(&args.connect)?;
    let mut results = Vec::new();
    for (strategy, name) in [
        (v1::GroupStrategy::StrategyRange, "range (eager)"),
        (v1::GroupStrategy::StrategyCooperativeSticky, "cooperative-sticky"),
    ] {
        results.push(measure(&client, &args, strategy, name).await?);
    }
    println!(
        "{:<20} {:>10} {:>22} {:>14} {:>12}",
        "strategy", "settle ms", "paused partition-s", "most paused", "generations"
    );
    for m in &results {
        println!(
            "{:<20} {:>10.1} {:>22.3} {:>14} {:>12}",
            m.strategy,
            m.settle.as_secs_f64() * 1000.0,
            m.paused_partition_seconds,
            m.most_paused,
            m.generations
        );
    }
    let line: Vec<String> = results
        .iter()
        .map(|m| {
            format!(
                "{}:settle_ms={:.1},paused_ps={:.3}",
                m.strategy.split(' ').next().unwrap_or(""),
                m.settle.as_secs_f64() * 1000.0,
                m.paused_partition_seconds
            )
        })
        .collect();
    println!("rebalance partitions={} members={}+1 {}", args.partitions, args.members, line.join(" "));
    Ok(())
}

/// The partitions some member may fetch from now, and whether the group is settled with `members` members.
fn flowing(info: &v1::GroupInfo, members: usize) -> (BTreeSet<u32>, bool) {
    let flowing: BTreeSet<u32> =
        info.members.iter().filter_map(|m| m.assignment.as_ref()).flat_map(|a| a.partitions.iter().copied()).collect();
    let settled = !info.rebalancing && info.members.len() == members && flowing.len() == info.partitions.len();
    (flowing, settled)
}

async fn measure(
    client: &Client,
    args: &RebalanceArgs,
    strategy: v1::GroupStrategy,
    name: &'static str,
) -> anyhow::Result<Measured> {
    let stream = format!("BENCH-REBALANCE-{}", strategy.as_str_name().to_lowercase().replace('_', "-"));
    let subjects = format!("{stream}.>");
    let _ = client.delete_stream(&stream).await;
    let config =
        v1::StreamConfig { subjects: vec![subjects], partitions: args.partitions, ..v1::StreamConfig::default() };
    client.create_stream(&stream, config).await.context("creating the stream")?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));

    // A steady trickle, keyed over many keys, so every partition has work.
    let publisher = {
        let (client, stream, stop, rate) = (client.clone(), stream.clone(), stop.clone(), args.rate);
        tokio::spawn(async move {
            let payload = Bytes::from(vec![b'x'; 64]);
            let mut index = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch = (rate / 20).max(1);
                let requests = (index..index + batch)
                    .map(|i| v1::PublishRequest {
                        subject: format!("{stream}.job"),
                        key: Some(Bytes::from(format!("key-{}", i % 4096))),
                        payload: payload.clone(),
                        ..v1::PublishRequest::default()
                    })
                    .collect();
                client.publish_batch(requests, 256).await;
                index += batch;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let options = MemberOptions {
        strategy,
        session_timeout: Duration::from_millis(args.heartbeat_ms * 30),
        heartbeat_every: Duration::from_millis(args.heartbeat_ms),
        config: v1::ConsumerConfig::default(),
    };
    let member = |index: usize| {
        let (client, stream, stop, acked, options) =
            (client.clone(), stream.clone(), stop.clone(), acked.clone(), options.clone());
        tokio::spawn(async move {
            let name = format!("m{index}");
            let mut me = GroupMember::join(client, &stream, "bench", &name, options, &mut Quiet).await?;
            while !stop.load(Ordering::Relaxed) {
                let deliveries = me.fetch(256, &mut Quiet).await?;
                if deliveries.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let items = cellog_client::acks_of(&deliveries);
                let n = items.len() as u64;
                me.ack(items).await?;
                acked.fetch_add(n, Ordering::Relaxed);
            }
            me.leave(&mut Quiet).await?;
            anyhow::Ok(())
        })
    };
    let mut members: Vec<_> = (0..args.members).map(member).collect();
    let group_info = || async { client.group_info(&stream, "bench").await.context("the group's info") };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The group exists once the first member's join is applied.
        if group_info().await.is_ok_and(|info| flowing(&info, args.members).1) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the first {} members did not settle in 60 s", args.members);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = group_info().await?.generation;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let joined = Instant::now();
    members.push(member(args.members));
    let (mut paused_partition_seconds, mut most_paused) = (0.0, 0usize);
    let mut last = joined;
    let settle = loop {
        let info = group_info().await?;
        let now = Instant::now();
        let (flowing_now, settled) = flowing(&info, args.members + 1);
        let paused = info.partitions.len() - flowing_now.len();
        paused_partition_seconds += paused as f64 * (now - last).as_secs_f64();
        most_paused = most_paused.max(paused);
        last = now;
        if settled {
            break (now - joined, info.generation);
        }
        anyhow::ensure!(now - joined < Duration::from_secs(60), "the group did not settle in 60 s after the join");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    stop.store(true, Ordering::Relaxed);
    publisher.await.context("the publisher")?;
    for member in members {
        member.await.context("a member")??;
    }
    let _ = client.delete_stream(&stream).await;
    Ok(Measured {
        strategy: name,
        settle: settle.0,
        paused_partition_seconds,
        most_paused,
        generations: settle.1 - before,
    })
}
