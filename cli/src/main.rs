//! `cellog`: runs a node (`cellog node`), a local three-node cell (`cellog dev`), and talks to a cell as a client:
//! streams, consumers, publishing, subscribing, transactions, membership, sealed mail and benchmarks.
//!
//! Built without its default `node` feature it is a client only: no `node`, `dev` or `keys`, and no RocksDB, Raft or
//! OpenPGP to compile.

mod bench;
mod bench_kit;
mod commands;
mod dev;
mod rebalance;
#[cfg(feature = "node")]
mod run;
mod soak;
mod table;
mod tail_bench;

use commands::{auth, cells, cluster, consumer, group, mail, peer, publish, stream, txn};

use clap::{Parser, Subcommand};

/// The process's allocator: jemalloc. A node allocates and frees per message (requests, entries, answers, RocksDB's
/// memtable blocks); glibc's allocator hands freed memory back to the kernel and takes page faults to get it again.
/// `scripts/bench` measured a tenth less node CPU per consumed message with jemalloc. (mimalloc measured faster
/// publishes at R1 but a p99 latency two to four times glibc's.) Its options are built in (`.cargo/config.toml`,
/// `JEMALLOC_SYS_WITH_MALLOC_CONF`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A replicated message log.
#[derive(Parser)]
#[command(name = "cellog", version, about = "A replicated message log.", propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The client addresses of `cellog dev`'s nodes: where client commands connect unless told otherwise.
const DEV_SERVERS: &str = "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403";

/// Where client commands connect.
#[derive(clap::Args, Clone, Debug)]
pub struct Connect {
    /// Client addresses of nodes of the cell (any one will do; the client finds the leader), comma-separated.
    #[arg(
        long,
        short = 's',
        global = true,
        env = "CELLOG_SERVER",
        value_delimiter = ',',
        default_value = DEV_SERVERS
    )]
    server: Vec<String>,
    /// Client addresses of nodes of the directory of many cells, comma-separated: `cells` commands ask it, and a
    /// command about a stream it places on another cell, or that moved there, is routed through it [default: the dev
    /// cell, when --server names nodes `cellog dev` runs; otherwise --server].
    #[arg(long, global = true, env = "CELLOG_DIRECTORY", value_delimiter = ',')]
    directory: Vec<String>,
    /// Talk to this cell of the directory (its addresses from the directory) instead of --server.
    #[arg(long = "cell", id = "to_cell", global = true, value_name = "CELL")]
    to_cell: Option<String>,
    /// Give up on a call after retrying this many seconds.
    #[arg(long, global = true, env = "CELLOG_TIMEOUT", default_value_t = 30)]
    timeout: u64,
    /// The API token calls carry (its principal's grants decide what they may do).
    #[arg(long, global = true, env = "CELLOG_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the API token [default: .cellog-dev/root.token, the local dev cell's root token, when it
    /// exists].
    #[arg(long, global = true, env = "CELLOG_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// The cell CA's certificate (PEM): talk to the nodes over TLS, verifying them with it [default:
    /// .cellog-dev/certs/ca.pem, the local dev cell's, when it exists].
    #[arg(long, global = true, env = "CELLOG_CA")]
    ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) naming the principal to run as (with --key), instead of a token.
    #[arg(long, global = true, env = "CELLOG_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, global = true, env = "CELLOG_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node of a cell on RocksDB under its data directory.
    #[cfg(feature = "node")]
    Node(Box<run::NodeArgs>),
    /// Run a local three-node cell in this process, with data under ./.cellog-dev (with `--cells N`, the directory
    /// of N more cells beside it).
    #[cfg(feature = "node")]
    Dev(dev::DevArgs),
    /// Create, list, inspect and delete streams.
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Create, update, list, inspect and delete consumers.
    #[command(subcommand)]
    Consumer(consumer::ConsumerCommand),
    /// Consumer groups: list, inspect, join as a member.
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// Register peers of a stream, whose received watermark holds retention back.
    #[command(subcommand)]
    Peer(peer::PeerCommand),
    /// Publish messages.
    Pub(publish::PubArgs),
    /// Receive messages through a durable consumer, acknowledging each.
    Sub(publish::SubArgs),
    /// Transactions: publish several messages atomically.
    #[command(subcommand)]
    Txn(txn::TxnCommand),
    /// Cell membership and status.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Many cells, through their directory: cells, streams' placements, moving a stream to another cell.
    #[command(subcommand)]
    Cells(cells::CellsCommand),
    /// Principals, their grants and API tokens.
    #[command(subcommand)]
    Auth(auth::AuthCommand),
    /// Quotas: what a tenant, and the cell as a whole, may hold.
    #[command(subcommand)]
    Quota(commands::quota::QuotaCommand),
    /// Sealed mail to other cells: send, delivery status, the inbox.
    #[command(subcommand)]
    Mail(mail::MailCommand),
    /// A cell's CA and the certificates it signs for nodes and clients (no server needed).
    #[cfg(feature = "node")]
    #[command(subcommand)]
    Certs(commands::certs::CertsCommand),
    /// This cell's key and the keyring of other cells' keys (in the data directory; no server needed).
    #[cfg(feature = "node")]
    #[command(subcommand)]
    Keys(commands::keys::KeysCommand),
    /// Measure publish and consume throughput and latency.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CELLOG_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        #[cfg(feature = "node")]
        Command::Node(args) => {
            init_logging("info,openraft=warn");
            run::node(*args).await
        }
        #[cfg(feature = "node")]
        Command::Dev(args) => {
            // Nodes of a starting cell cannot reach each other for a moment; openraft warns about each attempt.
            init_logging("warn,openraft=error");
            dev::dev(args).await
        }
        command => {
            init_logging("warn");
            match command {
                Command::Stream(command) => stream::run(command).await,
                Command::Consumer(command) => consumer::run(command).await,
                Command::Group(command) => group::run(command).await,
                Command::Peer(command) => peer::run(command).await,
                Command::Pub(args) => publish::publish(args).await,
                Command::Sub(args) => publish::subscribe(args).await,
                Command::Txn(command) => txn::run(command).await,
                Command::Cluster(command) => cluster::run(command).await,
                Command::Cells(command) => cells::run(command).await,
                Command::Auth(command) => auth::run(command).await,
                Command::Quota(command) => commands::quota::run(command).await,
                #[cfg(feature = "node")]
                Command::Keys(command) => commands::keys::run(command),
                #[cfg(feature = "node")]
                Command::Certs(command) => commands::certs::run(command).await,
                Command::Mail(command) => mail::run(command).await,
                Command::Bench(command) => bench::run(command).await,
                #[cfg(feature = "node")]
                Command::Node(_) | Command::Dev(_) => unreachable!("handled above"),
            }
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's arguments are well formed (clap checks names, flags and groups only in debug builds, and only
    /// when that subcommand is parsed: a clash would otherwise reach a user as a panic, or in a release build as a
    /// flag meaning one thing where another was meant).
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
