//! The chaos runner.
//!
//! ```sh
//! ci/chaos --seeds 0..500              # a sweep: one line per failure with its replay command; non-zero if any
//! ci/chaos --seed 17 [--drop 2,5]      # one seed (less some steps): its mix, schedule, verdicts, trace_hash
//!          [--trace FILE] [--history FILE]
//! ci/chaos --seed 17 --shrink          # the fewest steps of seed 17's schedule that still fail
//! ci/chaos --mutant epoch-off-by-one --seeds 0..50   # a sweep with one planted bug switched on
//! ci/chaos --moves --seeds 0..20       # the sweep across cells: a stream moved between two cells under faults
//! ci/chaos --planted [--max-seeds 200]  # every planted bug: seeds until caught; writes chaos/PLANTED.md
//! ci/chaos --regressions               # every kept failing schedule in chaos/regressions/; non-zero if any fails
//! ci/chaos --regression FILE           # one of them, with its verdicts (and --trace FILE, --history FILE)
//! ```

#[cfg(madsim)]
mod runner {
    use std::collections::BTreeSet;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use std::str::FromStr;

    use std::path::Path;

    use cellog_chaos::regressions::{DIRECTORY, Regression, files};
    use cellog_chaos::run::{Report, replay, run};
    use cellog_planted::Mutant;
    use strum::IntoEnumIterator;

    const USAGE: &str = "usage: chaos [--moves] [--mutant NAME] (--seeds A..B | --seed N [--drop I,J] [--shrink] [--trace FILE] \
                         [--history FILE]) | --planted [--max-seeds N] | --regressions | --regression FILE [--trace FILE] [--history FILE]";

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

    /// What failed first, if anything: a checker's violation, else liveness, else a harness panic.
    fn failure(result: &Result<Report, String>) -> Option<String> {
        match result {
            Err(panic) => Some(format!("harness: {panic}")),
            Ok(report) => report
                .violations
                .first()
                .map(|v| format!("{}: {}", v.property, v.found))
                .or_else(|| report.liveness.as_ref().map(|why| format!("liveness: {why}"))),
        }
    }

    /// The checkers a run's failure names, by short name ("liveness" and "harness" for those).
    fn caught_by(result: &Result<Report, String>) -> Vec<&'static str> {
        match result {
            Err(_) => vec!["harness"],
            Ok(report) => {
                let mut names: Vec<&'static str> = report.violations.iter().map(|v| v.checker).collect();
                if report.liveness.is_some() {
                    names.push("liveness");
                }
                names
            }
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
        let n_steps = cellog_chaos::run::plan_now(seed).1.len();
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
        // The shrunk schedule as a regression file, to keep under chaos/regressions/ once the fix is known.
        let (swarm, full) = cellog_chaos::run::plan_now(seed);
        let steps =
            full.into_iter().enumerate().filter(|(index, _)| !dropped.contains(index)).map(|(_, s)| s).collect();
        let regression = Regression {
            seed,
            failed: why,
            fix: String::new(),
            snapshot_every: swarm.snapshot_every,
            keep_logs: swarm.keep_logs,
            steps,
        };
        println!("\n# as a regression file (say what fixed it in `fix`):\n{}", regression.to_toml());
    }

    /// Replays every kept regression; exits non-zero if any fails again.
    fn regressions() {
        std::panic::set_hook(Box::new(|_| {}));
        let files = files(Path::new(DIRECTORY)).unwrap_or_else(|error| panic!("{error}"));
        let mut failures = 0;
        for path in &files {
            let regression = Regression::read(path).unwrap_or_else(|error| panic!("{error}"));
            let result = catch_unwind(AssertUnwindSafe(|| regression.run(path))).map_err(|_| "panicked".to_string());
            match failure(&result) {
                Some(why) => {
                    failures += 1;
                    println!("FAIL {} {why}\n  replay: ci/chaos --regression {}", path.display(), path.display());
                }
                None => println!("ok   {}", path.display()),
            }
        }
        println!("regressions={} failures={failures}", files.len());
        if failures > 0 {
            std::process::exit(1);
        }
    }

    /// Replays one regression with its verdicts.
    fn regression(path: &Path, trace: Option<String>, history: Option<String>) {
        let regression = Regression::read(path).unwrap_or_else(|error| {
            eprintln!("{error}");
            std::process::exit(2)
        });
        println!("{}\nfailed before: {}\nfix: {}", path.display(), regression.failed, regression.fix);
        let report = regression.run(path);
        write_out(trace, &report.trace, history, &report.history);
        for violation in &report.violations {
            println!("VIOLATED {}: {}", violation.property, violation.found);
        }
        if let Some(why) = &report.liveness {
            println!("LIVENESS {why}");
        }
        println!("trace_hash={}", cellog_sim::trace::hash(&report.trace));
        if !report.violations.is_empty() || report.liveness.is_some() {
            std::process::exit(1);
        }
    }

    /// Writes a run's trace and history where `--trace` and `--history` asked.
    fn write_out(trace: Option<String>, trace_text: &str, history: Option<String>, history_text: &str) {
        for (path, text) in [(trace, trace_text), (history, history_text)] {
            if let Some(path) = path {
                std::fs::write(&path, text).unwrap_or_else(|error| panic!("writing {path}: {error}"));
            }
        }
    }

    fn one(seed: u64, dropped: &BTreeSet<usize>, trace: Option<String>, history: Option<String>) {
        let (swarm, schedule) = cellog_chaos::run::plan_now(seed);
        println!("seed={seed}\nswarm: {swarm}\nschedule:");
        for (index, step) in schedule.iter().enumerate() {
            let dropped = if dropped.contains(&index) { " (dropped)" } else { "" };
            println!("  [{index}] {step}{dropped}");
        }
        let result = attempt(seed, dropped);
        let report = match result {
            Ok(report) => report,
            Err(panic) => {
                println!("FAIL seed={seed} harness: {panic}\n  replay: {}", replay(seed, dropped));
                std::process::exit(1);
            }
        };
        println!("acknowledged={}", report.acknowledged);
        write_out(trace, &report.trace, history, &report.history);
        for violation in &report.violations {
            println!("VIOLATED {}: {}", violation.property, violation.found);
        }
        if let Some(why) = &report.liveness {
            println!("LIVENESS {why}");
        }
        let failed = !report.violations.is_empty() || report.liveness.is_some();
        if failed {
            println!("  replay: {}", replay(seed, dropped));
        }
        println!("trace_hash={}", cellog_sim::trace::hash(&report.trace));
        if failed {
            std::process::exit(1);
        }
    }

    /// How a planted bug was caught: how many seeds until the checker of its invariant caught it, and what
    /// caught it first (and at which seed).
    struct Caught {
        by_its_checker: Option<u64>,
        first: Option<(u64, Vec<&'static str>)>,
    }

    /// Sweeps seeds from 0 with `mutant` on until the checker of its invariant catches it, at most `max`.
    fn sweep_planted(mutant: Mutant, max: u64) -> Caught {
        cellog_planted::set(Some(mutant));
        cellog_chaos::run::set_across_cells(cellog_chaos::planted::across_cells(mutant));
        let mut caught = Caught { by_its_checker: None, first: None };
        for seed in 0..max {
            let result = attempt(seed, &BTreeSet::new());
            let names = caught_by(&result);
            if names.is_empty() {
                continue;
            }
            caught.first.get_or_insert((seed + 1, names.clone()));
            if names.contains(&cellog_chaos::planted::invariant(mutant)) {
                caught.by_its_checker = Some(seed + 1);
                break;
            }
        }
        cellog_planted::set(None);
        cellog_chaos::run::set_across_cells(false);
        caught
    }

    /// Every planted bug, swept until the checker of its invariant caught it; writes the table to
    /// `chaos/PLANTED.md` and prints it. Exits non-zero when a bug's own checker missed it.
    fn planted(max: u64) {
        std::panic::set_hook(Box::new(|_| {}));
        let mut table = format!(
            "# Planted bugs\n\nEach row is a bug planted in the production code (compiled only into simulation builds, \
             `cellog_planted`), switched on alone, and the chaos sweep run from seed 0 until the checker of the \
             invariant it breaks caught it (at most {max} seeds). Other checkers may catch it first: that column \
             says what failed first, at which seed. Regenerate with `ci/chaos --planted --max-seeds {max}`.\n\n\
             | mutant | its invariant's checker | seeds until that checker caught it | first caught by (seed) |\n\
             | --- | --- | --- | --- |\n"
        );
        let mut missed = 0;
        for mutant in Mutant::iter().filter(|mutant| *mutant != Mutant::Canary) {
            let name: &'static str = mutant.into();
            let caught = sweep_planted(mutant, max);
            let by = caught.by_its_checker.map_or_else(
                || {
                    missed += 1;
                    format!("not within {max}")
                },
                |n| n.to_string(),
            );
            let first = caught.first.map_or(String::new(), |(n, names)| format!("{} ({n})", names.join(", ")));
            let row = format!("| `{name}` | {} | {by} | {first} |\n", cellog_chaos::planted::invariant(mutant));
            print!("{row}");
            table.push_str(&row);
        }
        // The canary should fail about one seed in a hundred: how many did.
        cellog_planted::set(Some(Mutant::Canary));
        let failed = (0..max).filter(|&seed| failure(&attempt(seed, &BTreeSet::new())).is_some()).count();
        cellog_planted::set(None);
        let row = format!("\nCanary (`canary`, meant to fail about 1 seed in 20): {failed} of {max} seeds failed.\n");
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
        let (mut all_regressions, mut one_regression) = (false, None);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--regressions" => all_regressions = true,
                "--regression" => one_regression = Some(args.next().unwrap_or_else(|| usage())),
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
                "--moves" => cellog_chaos::run::set_across_cells(true),
                "--trace" => trace = args.next(),
                "--history" => history = args.next(),
                _ => usage(),
            }
        }
        if let Some(max) = planted_max {
            return planted(max);
        }
        if all_regressions {
            return regressions();
        }
        if let Some(path) = one_regression {
            return regression(Path::new(&path), trace, history);
        }
        cellog_planted::set(plant);
        match (seeds, seed) {
            (Some(range), None) if range.is_empty() => {
                eprintln!("--seeds {}..{} sweeps no seed: a sweep must run at least one", range.start, range.end);
                std::process::exit(2)
            }
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
