//! Fuzzing on stable Rust, without instrumentation: each target is a function of bytes that must not panic, fed inputs
//! mutated from a corpus of valid ones (bit flips, interesting values, insertions, deletions, repeats, splices of two
//! inputs, truncations), by a seeded ChaCha stream so that a run is replayed by its seed. A panicking input is kept
//! (in `fuzz/crashes/`), and once its bug is fixed it joins the target's corpus, so that every later run starts from it.
//!
//! The targets are in `tests/targets.rs`: a short pass of each runs with the workspace's tests; a long run sets
//! `CELLOG_FUZZ_CASES` or `CELLOG_FUZZ_MINUTES` (and `CELLOG_FUZZ_SEED`) and runs the test binary.
//!
//! Written here rather than taken from a coverage-guided fuzzer: those need a nightly compiler (cargo-fuzz) or an
//! instrumented build of AFL++ per target (cargo-afl), neither of which this project's build may assume.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Most bytes of one mutated input: decoders are bounded well below, and a larger input only slows a run.
pub const MAX_INPUT: usize = 64 * 1024;

/// Values that sit at the edges of integer and length encodings (varint continuation bits, signs, maxima).
const INTERESTING: [u8; 10] = [0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0x40, 0x3f, 0x10, 0x20];

/// One input that made the target panic.
#[derive(Debug)]
pub struct Crash {
    /// The input.
    pub input: Vec<u8>,
    /// The panic's message.
    pub message: String,
}

/// What a run did.
#[derive(Debug)]
pub struct Run {
    /// Inputs tried.
    pub cases: u64,
    /// Inputs that panicked (at most a few are kept).
    pub crashes: Vec<Crash>,
}

/// The files of a target's corpus directory, in name order.
pub fn corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files.iter().filter_map(|file| std::fs::read(file).ok()).collect()
}

/// Mutates one input of `corpus` (an empty input when there is none) with one to eight mutations.
pub fn mutate(rng: &mut ChaCha8Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = match corpus.len() {
        0 => Vec::new(),
        n => corpus[rng.gen_range(0..n)].clone(),
    };
    for _ in 0..rng.gen_range(1..=8) {
        let len = input.len();
        match rng.gen_range(0..9) {
            0 if len > 0 => {
                let bit = rng.gen_range(0..len * 8);
                input[bit / 8] ^= 1 << (bit % 8);
            }
            1 if len > 0 => {
                let at = rng.gen_range(0..len);
                input[at] = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            }
            2 if len > 0 => {
                let at = rng.gen_range(0..len);
                input[at] = rng.r#gen();
            }
            3 => {
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.r#gen()).collect();
                input.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.gen_range(0..len);
                let end = (at + rng.gen_range(1..=16)).min(len);
                input.drain(at..end);
            }
            5 if len > 0 => {
                let at = rng.gen_range(0..len);
                let end = (at + rng.gen_range(1..=64)).min(len);
                let copy = input[at..end].to_vec();
                let to = rng.gen_range(0..=len);
                input.splice(to..to, copy);
            }
            6 if len > 0 => input.truncate(rng.gen_range(0..len)),
            7 if !corpus.is_empty() => {
                let other = &corpus[rng.gen_range(0..corpus.len())];
                if !other.is_empty() {
                    let from = rng.gen_range(0..other.len());
                    let at = rng.gen_range(0..=len);
                    input.truncate(at);
                    input.extend_from_slice(&other[from..]);
                }
            }
            _ => {
                // A varint-sized length or count, the likeliest way to ask a decoder for too much.
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=5);
                let mut bytes = vec![0xff; n];
                bytes[n - 1] = rng.gen_range(0..0x80);
                input.splice(at..at, bytes);
            }
        }
    }
    input.truncate(MAX_INPUT);
    input
}

/// How long a run goes on: a number of inputs, or a time (checked every thousand inputs).
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// This many inputs.
    Cases(u64),
    /// Inputs until this much time has passed.
    For(Duration),
}

/// Runs `target` on inputs mutated from `corpus` (each corpus input itself first) with the stream of `seed`, catching
/// panics, until the budget is spent or a few inputs have panicked.
pub fn run(corpus: &[Vec<u8>], budget: Budget, seed: u64, target: impl Fn(&[u8])) -> Run {
    // The panic hook is the process's: one run at a time silences it and puts the previous one back, so that runs on
    // several test threads do not leave it silenced for everything after them.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut crashes = Vec::new();
    let mut tried = 0;
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    #[allow(clippy::disallowed_methods, reason = "a long run is bounded by the time of the machine it runs on")]
    let started = Instant::now();
    for n in 0.. {
        let spent = match budget {
            Budget::Cases(cases) => n >= cases,
            Budget::For(time) => n % 1_000 == 0 && started.elapsed() >= time,
        };
        if spent {
            break;
        }
        let input = match corpus.get(n as usize) {
            Some(original) => original.clone(),
            None => mutate(&mut rng, corpus),
        };
        tried += 1;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| target(&input))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "a panic without a message".to_string());
            crashes.push(Crash { input, message });
            if crashes.len() >= 5 {
                break;
            }
        }
    }
    std::panic::set_hook(quiet);
    Run { cases: tried, crashes }
}

/// The budget of a run from the environment: `CELLOG_FUZZ_MINUTES` of inputs, or `CELLOG_FUZZ_CASES` of them (3 000
/// by default, the short pass of the workspace's tests).
pub fn budget_from_env() -> Budget {
    let var = |name: &str| std::env::var(name).ok().and_then(|text| text.parse::<u64>().ok());
    match var("CELLOG_FUZZ_MINUTES") {
        Some(minutes) => Budget::For(Duration::from_secs(minutes.saturating_mul(60))),
        None => Budget::Cases(var("CELLOG_FUZZ_CASES").unwrap_or(3_000)),
    }
}

/// The seed of a run from the environment: `CELLOG_FUZZ_SEED`, 1 by default.
pub fn seed_from_env() -> u64 {
    std::env::var("CELLOG_FUZZ_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or(1)
}

/// A fuzz target as a test: runs `f` over the corpus in `corpus_dir` and mutations of it, with the budget and seed of
/// the environment, and fails naming the inputs kept (in `fuzz/crashes/`) if any panicked.
pub fn fuzz(corpus_dir: &Path, target: &str, f: impl Fn(&[u8])) {
    let corpus = corpus(corpus_dir);
    assert!(!corpus.is_empty(), "{target} has no corpus in {}", corpus_dir.display());
    let run = run(&corpus, budget_from_env(), seed_from_env(), f);
    eprintln!("{target}: {} inputs, {} panicked", run.cases, run.crashes.len());
    if !run.crashes.is_empty() {
        let kept = keep(&Path::new(env!("CARGO_MANIFEST_DIR")).join("crashes"), target, &run.crashes);
        panic!(
            "{target}: {} inputs panicked, kept as {kept:?}; the first: {}",
            run.crashes.len(),
            run.crashes[0].message
        );
    }
}

/// Keeps each crash's input under `dir` (named by target and a hash of the input) and returns their paths.
pub fn keep(dir: &Path, target: &str, crashes: &[Crash]) -> Vec<PathBuf> {
    let _ = std::fs::create_dir_all(dir);
    crashes
        .iter()
        .filter_map(|crash| {
            let hash = crash
                .input
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            let path = dir.join(format!("{target}-{hash:016x}"));
            std::fs::write(&path, &crash.input).ok().map(|()| path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_mutates_alike_and_a_panic_is_caught_with_its_input() {
        let corpus = vec![b"hello".to_vec(), vec![0, 1, 2, 3]];
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..100).map(|_| mutate(&mut rng, &corpus)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(draw(7).iter().all(|input| input.len() <= MAX_INPUT));
        let run =
            run(&corpus, Budget::Cases(1_000), 7, |input| assert!(!input.starts_with(b"hello"), "starts with hello"));
        assert!(!run.crashes.is_empty());
        assert_eq!(run.crashes[0].input, b"hello");
        assert!(run.crashes[0].message.contains("starts with hello"), "{}", run.crashes[0].message);
    }
}
