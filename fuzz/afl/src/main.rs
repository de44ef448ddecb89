//! One fuzz target under AFL++: `cellog-fuzz-afl TARGET` reads inputs as AFL++ hands them over and runs the target
//! of that name (`../targets.rs`, the same functions the workspace's fuzz tests run). `scripts/fuzz-afl` builds and
//! runs it.

#[path = "../../targets.rs"]
#[allow(dead_code, reason = "the corpus writers are used by the workspace's tests, not here")]
mod targets;

const FUZZ_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some((_, target)) = targets::TARGETS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = targets::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("usage: cellog-fuzz-afl TARGET, one of: {}", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|input: &[u8]| target(input));
}
