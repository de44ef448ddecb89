//! Runs one seed of a simulated cell under the mixed workload (`cellog_sim::mixed`) and a seeded schedule of faults,
//! checks it, and prints the schedule and `trace_hash=<hex>` as its last line. The same seed prints the same hash;
//! `ci/sim-run --seed 7` wraps it.
//!
//! ```sh
//! RUSTFLAGS="--cfg madsim" cargo run --profile sim -p cellog-sim --bin sim-run -- --seed 7 [--trace FILE] [--history FILE]
//! ```

#[cfg(madsim)]
fn main() {
    use cellog_sim::seeds::Concern;
    use cellog_sim::{Cluster, fault, mixed};

    const USAGE: &str = "usage: sim-run --seed N [--trace FILE] [--history FILE]";
    let mut args = std::env::args().skip(1);
    let (mut seed, mut trace_file, mut history_file) = (None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => seed = args.next().and_then(|value| value.parse::<u64>().ok()),
            "--trace" => trace_file = args.next(),
            "--history" => history_file = args.next(),
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let Some(seed) = seed else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    let (trace, history, summary) = runtime.block_on(async move {
        let mut cluster = Cluster::new(3);
        cluster.set_replay(format!("ci/sim-run --seed {seed}"));
        let (mut faults, mut network) = (cluster.seeds().rng(Concern::Faults), cluster.seeds().rng(Concern::Network));
        let schedule = fault::simple_schedule(&mut faults, &mut network, &cluster.ids());
        let outcome = mixed::run(&mut cluster, &schedule).await;
        mixed::check(&cluster, &outcome);
        let steps: Vec<String> = schedule.iter().map(ToString::to_string).collect();
        let summary = format!(
            "seed={seed}\nschedule:\n  {}\nacknowledged={} transactions_committed={:?}",
            steps.join("\n  "),
            cluster.history().acknowledged().len(),
            outcome.committed
        );
        (cluster.trace().render(), cluster.history().render(), summary)
    });
    for (path, text) in [(trace_file, &trace), (history_file, &history)] {
        if let Some(path) = path {
            std::fs::write(&path, text).unwrap_or_else(|error| panic!("writing {path}: {error}"));
        }
    }
    println!("{summary}");
    println!("trace_lines={}", trace.lines().count());
    println!("trace_hash={}", cellog_sim::trace::hash(&trace));
}

#[cfg(not(madsim))]
fn main() {
    eprintln!("sim-run runs only in the simulation build: RUSTFLAGS=\"--cfg madsim\" (or use ci/sim-run)");
    std::process::exit(2);
}
