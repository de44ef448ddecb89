//! `cellog`: runs a node (`cellog node`), a local three-node cell (`cellog dev`), and talks to a cell as a client:
//! streams, consumers, publishing, subscribing, transactions, membership, sealed mail and benchmarks.

mod admin;
mod bench;
mod run;

use clap::{Parser, Subcommand};

/// A replicated message log.
#[derive(Parser)]
#[command(name = "cellog", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

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
        default_value = "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403"
    )]
    server: Vec<String>,
    /// Give up on a call after retrying this many seconds.
    #[arg(long, global = true, env = "CELLOG_TIMEOUT", default_value_t = 30)]
    timeout: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node of a cell on RocksDB under its data directory.
    Node(run::NodeArgs),
    /// Run a local three-node cell in this process, with data under ./.cellog-dev.
    Dev(run::DevArgs),
    /// Create, list, inspect and delete streams.
    #[command(subcommand)]
    Stream(admin::StreamCommand),
    /// Create, update, list, inspect and delete consumers.
    #[command(subcommand)]
    Consumer(admin::ConsumerCommand),
    /// Register peers of a stream, whose received watermark holds retention back.
    #[command(subcommand)]
    Peer(admin::PeerCommand),
    /// Publish messages.
    Pub(admin::PubArgs),
    /// Receive messages through a durable consumer, acknowledging each.
    Sub(admin::SubArgs),
    /// Transactions: publish several messages atomically.
    #[command(subcommand)]
    Txn(admin::TxnCommand),
    /// Cell membership and status.
    #[command(subcommand)]
    Cluster(admin::ClusterCommand),
    /// Sealed mail to other cells: send, delivery status, the inbox.
    #[command(subcommand)]
    Mail(admin::MailCommand),
    /// This cell's key and the keyring of other cells' keys (in the data directory; no server needed).
    #[command(subcommand)]
    Keys(admin::KeysCommand),
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
        Command::Node(args) => {
            init_logging("info,openraft=warn");
            run::node(args).await
        }
        Command::Dev(args) => {
            // Nodes of a starting cell cannot reach each other for a moment; openraft warns about each attempt.
            init_logging("warn,openraft=error");
            run::dev(args).await
        }
        command => {
            init_logging("warn");
            match command {
                Command::Stream(command) => admin::stream(command).await,
                Command::Consumer(command) => admin::consumer(command).await,
                Command::Peer(command) => admin::peer(command).await,
                Command::Pub(args) => admin::publish(args).await,
                Command::Sub(args) => admin::subscribe(args).await,
                Command::Txn(command) => admin::txn(command).await,
                Command::Cluster(command) => admin::cluster(command).await,
                Command::Keys(command) => admin::keys(command),
                Command::Mail(command) => admin::mail(command).await,
                Command::Bench(command) => bench::run(command).await,
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
