//! The chaos runner.
//!
//! ```sh
//! ci/chaos --seeds 0..500              # a sweep: one line per failure with its replay command; non-zero if any
//! ci/chaos --seed 17 [--drop 2,5]      # one seed (less some steps): its mix, schedule, verdicts, trace_hash
//!          [--trace FILE] [--history FILE]
//! ci/chaos --seed 17 --shrink          # the fewest steps of seed 17's schedule that still fail
//! ci/chaos --mutant epoch-off-by-one --seeds 0..50   # a sweep with one planted bug switched on
//! ci/chaos --planted [--max-seeds 200]  # every planted bug: seeds until caught; writes chaos/PLANTED.md
//! ```

#[cfg(madsim)]
mod runner {
    use std::collections::BTreeSet;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use std::str::FromStr;

    use cellog_chaos::run::{Report, replay, run};
    use cellog_planted::Mutant;
    use strum::IntoEnumIterator;

    const USAGE: &str = "usage: chaos [--mutant NAME] (--seeds A..B | --seed N [--drop I,J] [--shrink] [--trace FILE] \
                         [--history FILE]) | --planted [--max-seeds N]";

    fn usage() -> ! {
        eprintln!("{USAGE}");
        std::process::exit(2)
    }

    /// Runs a seed; a panic (the cell never converged, or the harness gave up) is a failure too.
    fn attempt(seed: u64, dropped: &BTreeSet<usize>) -> Result<Report, String> {
        catch_unwind(AssertUnwindSafe(|| run(seed, dropped))).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
                .unwrap_or_else(|| "panicked".to_string())
        })
    }

    fn failure(result: &Result<Report, String>) -> Option<String> {
        match result {
            Err(panic) => Some(format!("liveness or harness: {panic}")),
            Ok(report) => report.violations.first().map(|v| format!("{}: {}", v.property, v.found)),
        }
    }

    fn sweep(range: std::ops::Range<u64>) {
        // Failures are reported below, one line each; the default hook would print every panic in full.
        std::panic::set_hook(Box::new(|_| {}));
        let mut failures = 0;
        for seed in range.clone() {
            if let Some(why) = failure(&attempt(seed, &BTreeSet::new())) {
                failures += 1;
                println!("FAIL seed={seed} {why}\n  replay: {}", replay(seed, &BTreeSet::new()));
            }
        }
        println!("seeds={} failures={failures}", range.end - range.start);
        if failures > 0 {
            std::process::exit(1);
        }
    }

    fn shrink(seed: u64) {
        std::panic::set_hook(Box::new(|_| {}));
        let mut dropped = BTreeSet::new();
        let Some(why) = failure(&attempt(seed, &dropped)) else {
            println!("seed {seed} passes; nothing to shrink");
            return;
        };
        println!("seed {seed} fails: {why}");
        let n_steps = cellog_chaos::run::plan(seed, &cellog_chaos::run::NODES).1.len();
        for step in 0..n_steps {
            dropped.insert(step);
            match failure(&attempt(seed, &dropped)) {
                Some(why) => println!("  without step {step} it still fails: {why}"),
                None => {
                    dropped.remove(&step);
                    println!("  step {step} is needed");
                }
            }
        }
        println!("shrunk to {} of {n_steps} steps\n  replay: {}", n_steps - dropped.len(), replay(seed, &dropped));
    }

    fn one(seed: u64, dropped: &BTreeSet<usize>, trace: Option<String>, history: Option<String>) {
        let (swarm, schedule) = cellog_chaos::run::plan(seed, &cellog_chaos::run::NODES);
        println!("seed={seed}\nswarm: {swarm}\nschedule:");
        for (index, step) in schedule.iter().enumerate() {
            let dropped = if dropped.contains(&index) { " (dropped)" } else { "" };
            println!("  [{index}] {step}{dropped}");
        }
        let result = attempt(seed, dropped);
        let report = match result {
            Ok(report) => report,
            Err(panic) => {
                println!("FAIL seed={seed} liveness or harness: {panic}\n  replay: {}", replay(seed, dropped));
                std::process::exit(1);
            }
        };
        println!("acknowledged={}", report.acknowledged);
        for (path, text) in [(trace, &report.trace), (history, &report.history)] {
            if let Some(path) = path {
                std::fs::write(&path, text).unwrap_or_else(|error| panic!("writing {path}: {error}"));
            }
        }
        for violation in &report.violations {
            println!("VIOLATED {}: {}", violation.property, violation.found);
        }
        if !report.violations.is_empty() {
            println!("  replay: {}", replay(seed, dropped));
        }
        println!("trace_hash={}", cellog_sim::trace::hash(&report.trace));
        if !report.violations.is_empty() {
            std::process::exit(1);
        }
    }

    /// Seeds until the first failure of `mutant`, at most `max`: the number of seeds it took, if caught.
    fn seeds_to_catch(mutant: Mutant, max: u64) -> Option<(u64, String)> {
        cellog_planted::set(Some(mutant));
        let caught = (0..max).find_map(|seed| failure(&attempt(seed, &BTreeSet::new())).map(|why| (seed + 1, why)));
        cellog_planted::set(None);
        caught
    }

    /// The property a failure names (for a liveness or harness failure, also what went wrong), without its details.
    fn caught_by(why: &str) -> String {
        let parts = if why.starts_with("liveness or harness") { 2 } else { 1 };
        why.splitn(parts + 1, ": ").take(parts).collect::<Vec<_>>().join(": ")
    }

    /// Every planted bug, swept until caught; writes the table to `chaos/PLANTED.md` and prints it.
    fn planted(max: u64) {
        std::panic::set_hook(Box::new(|_| {}));
        let mut table = format!(
            "# Planted bugs\n\nEach row is a bug planted in the production code (compiled only into simulation builds, \
             `cellog_planted`), switched on alone, and the chaos sweep run from seed 0 until a checker caught it \
             (at most {max} seeds). Regenerate with `ci/chaos --planted --max-seeds {max}`.\n\n\
             | mutant | seeds to catch | caught by |\n| --- | --- | --- |\n"
        );
        let mut missed = 0;
        for mutant in Mutant::iter().filter(|mutant| *mutant != Mutant::Canary) {
            let name: &'static str = mutant.into();
            let row = match seeds_to_catch(mutant, max) {
                Some((n, why)) => format!("| `{name}` | {n} | {} |\n", caught_by(&why)),
                None => {
                    missed += 1;
                    format!("| `{name}` | not within {max} | |\n")
                }
            };
            print!("{row}");
            table.push_str(&row);
        }
        // The canary should fail about one seed in a hundred: how many did.
        cellog_planted::set(Some(Mutant::Canary));
        let failed = (0..max).filter(|&seed| failure(&attempt(seed, &BTreeSet::new())).is_some()).count();
        cellog_planted::set(None);
        let row = format!("\nCanary (`canary`, meant to fail about 1 seed in 100): {failed} of {max} seeds failed.\n");
        print!("{row}");
        table.push_str(&row);
        std::fs::write("chaos/PLANTED.md", table).unwrap_or_else(|error| panic!("writing chaos/PLANTED.md: {error}"));
        if missed > 0 {
            std::process::exit(1);
        }
    }

    pub fn main() {
        let mut args = std::env::args().skip(1);
        let (mut seeds, mut seed, mut dropped, mut shrinking) = (None, None, BTreeSet::new(), false);
        let (mut trace, mut history) = (None, None);
        let (mut planted_max, mut plant) = (None, None);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--planted" => planted_max = Some(200),
                "--max-seeds" => {
                    planted_max = Some(args.next().and_then(|value| value.parse().ok()).unwrap_or_else(|| usage()));
                }
                "--mutant" => {
                    let name = args.next().unwrap_or_else(|| usage());
                    plant = Some(Mutant::from_str(&name).unwrap_or_else(|_| {
                        let names: Vec<&'static str> = Mutant::iter().map(Into::into).collect();
                        eprintln!("no mutant {name:?}; there are: {}", names.join(", "));
                        std::process::exit(2)
                    }));
                }
                "--seeds" => {
                    let range = args.next().unwrap_or_else(|| usage());
                    let (from, to) = range.split_once("..").unwrap_or_else(|| usage());
                    seeds = Some(from.parse().unwrap_or_else(|_| usage())..to.parse().unwrap_or_else(|_| usage()));
                }
                "--seed" => seed = Some(args.next().and_then(|value| value.parse().ok()).unwrap_or_else(|| usage())),
                "--drop" => {
                    let list = args.next().unwrap_or_else(|| usage());
                    dropped = list.split(',').map(|index| index.parse().unwrap_or_else(|_| usage())).collect();
                }
                "--shrink" => shrinking = true,
                "--trace" => trace = args.next(),
                "--history" => history = args.next(),
                _ => usage(),
            }
        }
        if let Some(max) = planted_max {
            return planted(max);
        }
        cellog_planted::set(plant);
        match (seeds, seed) {
            (Some(range), None) => sweep(range),
            (None, Some(seed)) if shrinking => shrink(seed),
            (None, Some(seed)) => one(seed, &dropped, trace, history),
            _ => usage(),
        }
    }
}

#[cfg(madsim)]
fn main() {
    runner::main();
}

#[cfg(not(madsim))]
fn main() {
    eprintln!("chaos runs only in the simulation build: RUSTFLAGS=\"--cfg madsim\" (or use ci/chaos)");
    std::process::exit(2);
}
