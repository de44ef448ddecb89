//! Draws a trace (from `ci/chaos --trace`, `ci/sim-run --trace`, or a golden snapshot) as a space-time diagram.
//!
//! ```sh
//! cargo run -p cellog-golden --bin trace-view -- run.trace [run.html]
//! ```

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(input) = args.next() else {
        eprintln!("usage: trace-view TRACE [HTML]   (writes TRACE.html when HTML is not given)");
        std::process::exit(2);
    };
    let output = args.next().unwrap_or_else(|| format!("{input}.html"));
    let trace = std::fs::read_to_string(&input).unwrap_or_else(|error| {
        eprintln!("cannot read {input}: {error}");
        std::process::exit(1);
    });
    if let Err(error) = std::fs::write(&output, cellog_golden::view::html(&input, &trace)) {
        eprintln!("cannot write {output}: {error}");
        std::process::exit(1);
    }
    println!("{output}");
}
