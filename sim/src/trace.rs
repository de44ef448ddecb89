//! The trace of a run: one line per state transition, in simulated time.
//!
//! Nodes report their transitions as `tracing` events under `cellog_raft::transition::TARGET` (applied entries,
//! effects, role, membership, snapshots, repair); the harness reports the faults it injects under the same target.
//! [`Trace::install`] collects them for the current simulation, naming each line's lane after the madsim node the
//! event came from (or the event's own `node` field). Lines hold simulated time, never wall time, and no addresses,
//! so a seed's trace is the same on every run, and [`Trace::hash`] fingerprints it.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use cellog_raft::transition::TARGET;
use sha2::{Digest, Sha256};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// What the trace's lines mean, printed at its top.
pub const LEGEND: &str = "\
# cellog simulation trace
# time (simulated seconds)  lane (n<id> a node, client, harness)  event  fields
# events:
#   apply          an entry applied: index, cell time `at`, command kinds×count, result kinds×count
#   appended       messages appended by that entry: stream, partition, seqs (runs)
#   removed        messages removed by retention: stream, partition, seqs, reason
#   expired        a delivery passed its ack deadline: stream, consumer, partition, seq, delivery_count
#   dead-lettered  a message left a consumer for good: ..., copy (dead-letter stream/partition:seq, or none)
#   recalled       a message became a tombstone
#   txn-committed  a transaction became visible: producer_id, epoch, n_messages
#   txn-aborted    a transaction was dropped: producer_id, epoch, reason
#   stream-deleted a stream was deleted
#   membership     a membership entry applied: voters, learners
#   role           a node's Raft role, term or known leader changed
#   snapshot       a node holds a new snapshot up to index
#   purged         a node purged its log up to index
#   kept-log-over-budget  the log behind a node's snapshot is over its byte budget: purge asked up to `up_to`
#   cell-id        a node took its cell's id: `how` made (founding the cell) or learned (from a leader's entries)
#   repairing      a node found a damaged log and will not vote until it holds entries up to `until` again
#   repaired       ... and now it does
#   body-repaired  a message body the node's disk damaged was written again from a peer's copy: key, from (the peer)
#   granted        a principal was created or its grants replaced: principal, publish, subscribe, consume, admin,
#                  cluster_admin
#   principal-deleted, token-added, token-revoked   principals and their API tokens (a token named by the first
#                  8 bytes of its SHA-256)
#   panicked       a task panicked: `what`, and `at` where; a node whose task panicked is restarted on its disk
#                  1 to 10 s later (as a supervisor restarts a process that exits), and the run fails
#   exited         a node's process exited, as `cellog node` does when the node cannot go on (`reason`): it starts
#                  again on its disk 1 to 10 s later, as a supervisor restarts it
#   apply-panicked applying the entry at `index` in `term` panicked (the node's replica is interrupted)
#   apply-halted   a node stopped applying at `index`, as its operator asked (--halt-apply-at)
#   entry-skipped  a node passed over the entry at `index` in `term`, as its operator asked (--skip-entry)
#   refused        a node refused a client's command before proposing it (its credential or its principal's grants):
#                  command kind, reason, detail; nothing reached the log
# what the harness does, on the lane of the node it hits:
#   crash          the node's process dies; its disk keeps what its page cache held
#   power-off      the node loses power; its disk keeps only what was synced
#   lose-disk      the node loses power and its whole data directory: it restarts on an empty disk
#   restart        the node starts again on its disk
#   pause, resume  the node's process stops being scheduled, and goes on
#   clock-jump     the node's clock moves by `by` milliseconds
#   disk-faults    the node's disk starts failing at the given rates (parts per million)
#   set-apply      what the node is told about the entries it applies at its next start (halt, skip)
#   partition, one-way, isolate, heal, network   links cut (both ways or one), and restored; network loss and latency
#   add-node, remove-node                         a membership change through the client API
#   read           what a scenario read back, e.g. the sender the cell stamped on a message
";

/// Simulated time since the simulation began.
pub fn simulated_elapsed() -> Duration {
    madsim::time::TimeHandle::current().elapsed()
}

/// The collected lines of a run.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
}

/// Keeps a [`Trace`] collecting until dropped.
#[must_use = "the trace collects only while the guard lives"]
pub struct TraceGuard {
    _default: tracing::subscriber::DefaultGuard,
}

/// The madsim node a span belongs to, kept in the span's extensions.
struct Lane(String);

/// Reads the `name` field of madsim's `node` span.
struct NodeName(Option<String>);

impl Visit for NodeName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_string());
        }
    }
}

/// The lane madsim's node name stands for: `node-2` is `n2`, the main task is the harness.
fn lane_of(name: &str) -> String {
    match name.strip_prefix("node-") {
        Some(id) => format!("n{id}"),
        None if name == "madsim-main" => "harness".to_string(),
        None => name.to_string(),
    }
}

/// An event's message, its `node` field (when the harness names one) and its other fields as `key=value`.
#[derive(Default)]
struct Line {
    message: String,
    node: Option<String>,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "node" => self.node = Some(value.to_string()),
            name => {
                let _ = write!(self.fields, " {name}={value}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "node" => self.node = Some(format!("{value:?}")),
            name => {
                let _ = write!(self.fields, " {name}={value:?}");
            }
        }
    }
}

struct Collect {
    trace: Trace,
    start: Duration,
}

/// Whether the trace wants a callsite: transition events, madsim's `node` and `task` spans (for lanes), and errors from cellog
/// code (printed, so that a node that failed to start says why).
fn wanted(metadata: &Metadata<'_>) -> bool {
    if metadata.is_span() {
        // A task's span is what madsim enters while polling it; its parent, the node's, names the lane.
        matches!(metadata.name(), "node" | "task") && metadata.target().starts_with("madsim")
    } else {
        metadata.target() == TARGET || (*metadata.level() == Level::ERROR && metadata.target().starts_with("cellog"))
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collect {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if wanted(metadata) { Interest::always() } else { Interest::never() }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "node" {
            return;
        }
        let mut name = NodeName(None);
        attrs.record(&mut name);
        if let (Some(name), Some(span)) = (name.0, ctx.span(id)) {
            span.extensions_mut().insert(Lane(lane_of(&name)));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        if event.metadata().target() != TARGET {
            if *event.metadata().level() == Level::ERROR {
                eprintln!("ERROR {}: {}{}", event.metadata().target(), line.message, line.fields);
            }
            return;
        }
        let lane = line.node.map(|node| format!("n{node}")).or_else(|| {
            ctx.event_scope(event)?.find_map(|span| span.extensions().get::<Lane>().map(|lane| lane.0.clone()))
        });
        let lane = lane.unwrap_or_else(|| "harness".to_string());
        let elapsed = simulated_elapsed().saturating_sub(self.start);
        let text = format!("{:>9.3} {lane:<7} {}{}", elapsed.as_secs_f64(), line.message, line.fields);
        self.trace.lock().push(text);
    }
}

impl Trace {
    /// Starts collecting transition events for the current simulation, timed from now, until the guard is dropped.
    /// Other events go to standard error as `RUST_LOG` says (errors only, by default).
    pub fn install() -> (Trace, TraceGuard) {
        report_panics();
        let trace = Trace::default();
        let collect = Collect { trace: trace.clone(), start: simulated_elapsed() };
        let guard = match EnvFilter::try_from_default_env() {
            // With RUST_LOG, the log too; each layer filters what it sees.
            Ok(filter) => {
                let log = tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .without_time()
                    .with_ansi(false)
                    .with_filter(filter);
                // madsim's `node` spans name the lanes, so the trace must see them too.
                let collect = collect
                    .with_filter(Targets::new().with_target(TARGET, Level::DEBUG).with_target("madsim", Level::ERROR));
                tracing::subscriber::set_default(tracing_subscriber::registry().with(collect).with(log))
            }
            // Without, only what the trace needs is ever enabled.
            Err(_) => tracing::subscriber::set_default(tracing_subscriber::registry().with(collect)),
        };
        (trace, TraceGuard { _default: guard })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lock().clone()
    }

    /// The legend and the lines, as a reviewer reads them.
    pub fn render(&self) -> String {
        let mut text = LEGEND.to_string();
        for line in self.lock().iter() {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// The `panicked` lines of nodes (not of the harness or a client), in order.
    pub fn node_panics(&self) -> Vec<String> {
        let panicked = |line: &&String| {
            let mut words = line.split_whitespace().skip(1);
            let lane = words.next().unwrap_or_default();
            let node =
                lane.strip_prefix('n').is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
            node && words.next() == Some("panicked")
        };
        self.lock().iter().filter(panicked).map(|line| line.trim_start().to_string()).collect()
    }

    /// [`hash`] of [`Trace::render`]: equal for equal runs.
    pub fn hash(&self) -> String {
        hash(&self.render())
    }
}

/// How a simulated node's process exits when the node cannot go on, as `cellog node` exits non-zero: raised as a
/// panic with this payload, which ends the process (madsim starts it again 1 to 10 s later, as a supervisor restarts
/// a process that exits). The trace shows it as `exited`, not `panicked`, and it fails no run.
pub struct Exit(pub String);

/// Makes every panic also a `panicked` event of the trace, on the lane of the task that panicked (the panic hook
/// runs inside the task's span), before the hook there was runs. Installed once per process.
fn report_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let earlier = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            if let Some(Exit(reason)) = payload.downcast_ref::<Exit>() {
                tracing::warn!(target: TARGET, reason, "exited");
                return;
            }
            let what = payload
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_string());
            let at = info.location().map(|at| format!("{}:{}", at.file(), at.line())).unwrap_or_default();
            tracing::error!(target: TARGET, what, at, "panicked");
            earlier(info);
        }));
    });
}

/// SHA-256 of a rendered trace, in hex.
pub fn hash(rendered: &str) -> String {
    hex::encode(Sha256::digest(rendered.as_bytes()))
}

/// Records what the harness did to the cell (a fault, a heal, a membership change), on the lane of the node it hits, or
/// the harness's own lane for the whole cell.
pub fn harness(node: Option<u64>, what: &str, detail: &str) {
    match node {
        Some(node) if detail.is_empty() => tracing::info!(target: TARGET, node, "{what}"),
        Some(node) => tracing::info!(target: TARGET, node, "{what} {detail}"),
        None if detail.is_empty() => tracing::info!(target: TARGET, "{what}"),
        None => tracing::info!(target: TARGET, "{what} {detail}"),
    }
}
