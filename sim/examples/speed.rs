//! How much faster than real time a simulated cell runs: a 3-node cell idle, then under a steady publish load, with
//! the scenarios' frequent snapshots and with production's. Prints simulated seconds per wall second for each.
//!
//! ```sh
//! RUSTFLAGS="--cfg madsim" cargo run --release -p cellog-sim --example speed -- [SIM_SECONDS] [MSGS_PER_SECOND]
//! ```

#[cfg(madsim)]
fn main() {
    use std::time::Duration;

    use bytes::Bytes;
    use cellog_client::proto as v1;
    use cellog_sim::Cluster;

    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|arg| arg.parse().ok()).unwrap_or(60);
    let rate: u64 = args.next().and_then(|arg| arg.parse().ok()).unwrap_or(1000);

    let run = |load: bool, snapshot_every: u64| {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default());
        #[allow(clippy::disallowed_methods, reason = "wall time, measured outside the simulation")]
        let started = std::time::Instant::now();
        let published = runtime.block_on(async move {
            let cluster = Cluster::with_snapshot_every(3, snapshot_every);
            cluster.wait_leader().await;
            let client = cluster.client();
            cluster
                .on_client(async move {
                    let config = v1::StreamConfig { subjects: vec!["load.>".to_string()], ..Default::default() };
                    client.create_stream("load", config).await.expect("created");
                    let tick = Duration::from_millis(10);
                    let per_tick = usize::try_from(rate / 100).unwrap_or(1).max(1);
                    let mut published = 0u64;
                    for round in 0..seconds * 100 {
                        if load {
                            let requests = (0..per_tick)
                                .map(|n| v1::PublishRequest {
                                    subject: "load.x".to_string(),
                                    payload: Bytes::from(vec![b'x'; 256]),
                                    msg_id: Some(format!("{round}-{n}")),
                                    ..Default::default()
                                })
                                .collect();
                            for result in client.publish_batch(requests, 64).await {
                                published += u64::from(result.result.is_ok());
                            }
                        }
                        tokio::time::sleep(tick).await;
                    }
                    published
                })
                .await
        });
        let wall = started.elapsed().as_secs_f64();
        (published, wall)
    };
    let (_, idle_wall) = run(false, cellog_sim::SIM_SNAPSHOT_EVERY);
    println!("idle: {seconds} simulated s in {idle_wall:.2} wall s = {:.0}x", seconds as f64 / idle_wall);
    for snapshot_every in [cellog_sim::SIM_SNAPSHOT_EVERY, 50_000] {
        let (published, wall) = run(true, snapshot_every);
        println!(
            "{rate} msg/s, snapshot every {snapshot_every} entries: {seconds} simulated s ({published} messages) in \
             {wall:.2} wall s = {:.0}x",
            seconds as f64 / wall
        );
    }
}

#[cfg(not(madsim))]
fn main() {
    eprintln!("build with RUSTFLAGS=\"--cfg madsim\"");
}
