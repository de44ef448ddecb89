//! `cellog node` and `cellog dev`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use cellog_client::ClientTls;
use cellog_core::TokenHash;
use cellog_envelope::{CellKey, Keyring};
use cellog_mail::{MailConfig, RetryPolicy};
use cellog_net::auth::{Callers, PrincipalRate};
use cellog_net::metrics::Metered;
use cellog_net::mirror::MirrorOptions;
use cellog_net::tls::TlsFiles;
use cellog_net::{Limits, NodeConfig, Peer, RaftTiming, RunningNode};
use cellog_raft::storage::RocksStorage;
use cellog_raft::{ApplyControl, CellNode, Past, SystemClock};
use rand::RngCore;
use serde::Deserialize;

/// `cellog node`: every setting is a flag, an environment variable, or a key of the TOML file given with `--config`
/// (in that order of precedence).
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// A TOML file with any of the settings below (keys as the flags, with underscores: `data_dir`, `peers`, ...).
    #[arg(long, env = "CELLOG_CONFIG")]
    config: Option<PathBuf>,
    /// This node's id in the cell [default: 1].
    #[arg(long, env = "CELLOG_ID")]
    id: Option<u64>,
    /// The cell's name; nodes refuse Raft messages from another cell [default: cellog].
    #[arg(long, env = "CELLOG_CELL")]
    cell: Option<String>,
    /// Where the node keeps its data [default: ./cellog-data].
    #[arg(long, env = "CELLOG_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Where it serves clients [default: 127.0.0.1:7401].
    #[arg(long, env = "CELLOG_CLIENT_ADDR")]
    client_addr: Option<SocketAddr>,
    /// Where it serves its peers [default: 127.0.0.1:7501].
    #[arg(long, env = "CELLOG_RAFT_ADDR")]
    raft_addr: Option<SocketAddr>,
    /// Where it serves HTTP: the JSON API, live tails, the console and Prometheus metrics on /metrics [default:
    /// 127.0.0.1:7601; "off" for none]. Also `--metrics-addr` and CELLOG_METRICS_ADDR, as before.
    #[arg(long, alias = "metrics-addr", env = "CELLOG_HTTP_ADDR")]
    http_addr: Option<String>,
    /// The client address other nodes and clients are told [default: --client-addr].
    #[arg(long, env = "CELLOG_ADVERTISE_CLIENT_ADDR")]
    advertise_client_addr: Option<String>,
    /// The peer address other nodes are told [default: --raft-addr].
    #[arg(long, env = "CELLOG_ADVERTISE_RAFT_ADDR")]
    advertise_raft_addr: Option<String>,
    /// Another founding node: ID=RAFT_ADDR/CLIENT_ADDR (repeat, or comma-separate).
    #[arg(long = "peer", env = "CELLOG_PEERS", value_delimiter = ',')]
    peers: Vec<String>,
    /// Found the cell (this node and its peers) if the data directory is new [default: true]. Off for a node that
    /// will be added to an existing cell with `cellog cluster add`.
    #[arg(long, env = "CELLOG_BOOTSTRAP")]
    bootstrap: Option<bool>,
    /// Raft heartbeat interval in milliseconds [default: 100].
    #[arg(long, env = "CELLOG_HEARTBEAT_MS")]
    heartbeat_ms: Option<u64>,
    /// Shortest election timeout in milliseconds; the longest is 1.5 times that [default: 350].
    #[arg(long, env = "CELLOG_ELECTION_TIMEOUT_MS")]
    election_timeout_ms: Option<u64>,
    /// Log entries between snapshots [default: 50000].
    #[arg(long, env = "CELLOG_SNAPSHOT_EVERY")]
    snapshot_every: Option<u64>,
    /// MiB of log between snapshots, whatever their count, or twice the last snapshot's size if that is more: what a
    /// restart replays is bounded by it [default: 64].
    #[arg(long, env = "CELLOG_SNAPSHOT_EVERY_MIB")]
    snapshot_every_mib: Option<u64>,
    /// Most MiB of log kept behind a snapshot; a follower further behind gets the snapshot [default: 256].
    #[arg(long, env = "CELLOG_KEEP_LOG_MIB")]
    keep_log_mib: Option<u64>,
    /// Where another cell is reached for sealed mail: CELL=CLIENT_ADDR (repeat, or comma-separate; a cell named
    /// again gets another address).
    #[arg(long = "home", env = "CELLOG_HOMES", value_delimiter = ',')]
    homes: Vec<String>,
    /// The CA certificate of another cell whose nodes serve TLS: CELL=PATH (repeat, or comma-separate). Its nodes
    /// are then reached over TLS and verified with it; a cell without one is reached in plaintext.
    #[arg(long = "home-ca", env = "CELLOG_HOME_CAS", value_delimiter = ',')]
    home_cas: Vec<String>,
    /// Serve callers without a credential as the root principal, and listen off loopback without TLS. Only for a
    /// node every caller of which is trusted; never with TLS.
    #[arg(long, env = "CELLOG_INSECURE")]
    insecure: bool,
    /// A file holding a token that reads /metrics and nothing else (give it to Prometheus as its bearer token; any
    /// 32+ random characters, e.g. `cellog auth token new` on any cell). A cluster admin's token reads it too.
    #[arg(long, env = "CELLOG_METRICS_TOKEN_FILE")]
    metrics_token_file: Option<PathBuf>,
    /// Commands per second each principal but root may send this node (0: unlimited) [default: 20000].
    #[arg(long, env = "CELLOG_PRINCIPAL_RATE")]
    principal_rate: Option<u32>,
    /// Commands each principal may send at once after a quiet spell [default: twice the rate].
    #[arg(long, env = "CELLOG_PRINCIPAL_BURST")]
    principal_burst: Option<u32>,
    /// Commands per second all the principals of one tenant together may send this node (0: unlimited)
    /// [default: 50000].
    #[arg(long, env = "CELLOG_TENANT_RATE")]
    tenant_rate: Option<u32>,
    /// Commands one tenant may send at once after a quiet spell [default: twice the rate].
    #[arg(long, env = "CELLOG_TENANT_BURST")]
    tenant_burst: Option<u32>,
    /// Commands per second every caller but root together may send this node [default: unlimited].
    #[arg(long, env = "CELLOG_CELL_RATE")]
    cell_rate: Option<u32>,
    /// Commands every caller together may send at once after a quiet spell [default: twice the rate].
    #[arg(long, env = "CELLOG_CELL_BURST")]
    cell_burst: Option<u32>,
    /// Publishes per second to one subject, all the principals of its tenant together, on this node
    /// [default: unlimited].
    #[arg(long, env = "CELLOG_SUBJECT_RATE")]
    subject_rate: Option<u32>,
    /// Publishes to one subject at once after a quiet spell [default: twice the rate].
    #[arg(long, env = "CELLOG_SUBJECT_BURST")]
    subject_burst: Option<u32>,
    /// Connections open on the client port (and, apart, the HTTP port) at once; one past them is closed unread
    /// [default: 4096].
    #[arg(long, env = "CELLOG_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Calls open on one client connection at once; a client's next call waits for one to end [default: 256].
    #[arg(long, env = "CELLOG_MAX_CALLS_PER_CONNECTION")]
    max_calls_per_connection: Option<u32>,
    /// Subscriptions open on this node at once; past them, Subscribe is refused as TOO_MANY_SUBSCRIPTIONS
    /// [default: 4096].
    #[arg(long, env = "CELLOG_MAX_SUBSCRIPTIONS")]
    max_subscriptions: Option<usize>,
    /// Subscriptions (and, apart, HTTP tails) one principal but root holds open on this node at once; past them, its
    /// next is refused as TOO_MANY_SUBSCRIPTIONS (TOO_MANY_TAILS) [default: 1024].
    #[arg(long, env = "CELLOG_MAX_SUBSCRIPTIONS_PER_PRINCIPAL")]
    max_subscriptions_per_principal: Option<usize>,
    /// The free-disk watermark, in MiB: below it the leader refuses writes that grow the store as STORAGE_FULL and
    /// keeps serving reads, acks and deletes; 0 turns it off [default: 256].
    #[arg(long, env = "CELLOG_MIN_FREE_DISK_MIB")]
    min_free_disk_mib: Option<u64>,
    /// Bytes of requests, in MiB, all callers together may have sent this node and not yet had read (on the client
    /// and HTTP ports); past them a request is refused as REQUEST_BYTES. At least 22 [default: 256].
    #[arg(long, env = "CELLOG_MAX_REQUEST_MIB_IN_FLIGHT")]
    max_request_mib_in_flight: Option<u64>,
    /// Apply no log entry at or past this index: the node starts, votes and replicates its log, serves what it applied
    /// before, and refuses writes and linearizable reads as APPLY_HALTED. The way to keep a cell up when an entry
    /// panics on every node (the panic names the entry); give it to every node. Not read from the config file: it is
    /// for one start.
    #[arg(long, value_name = "INDEX")]
    halt_apply_at: Option<u64>,
    /// Pass over the log entry at INDEX in term TERM as if it held no command: its commands are answered
    /// ENTRY_SKIPPED and nothing of them is written. The way past an entry that panics on every node (the panic names
    /// both numbers); give the same to every node, or their states differ. Repeat for more entries.
    #[arg(long, value_name = "INDEX:TERM", value_parser = ApplyControl::parse_entry)]
    skip_entry: Vec<(u64, u64)>,
    /// Longest a client call may take to answer, in milliseconds; a stream's answer starts at once and is not cut
    /// [default: 30000].
    #[arg(long, env = "CELLOG_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: Option<u64>,
    /// How often an idle connection is probed, and how long a probe may go unanswered before it is closed, in
    /// milliseconds [default: 20000].
    #[arg(long, env = "CELLOG_KEEPALIVE_MS")]
    keepalive_ms: Option<u64>,
    /// A file holding a token the node makes a token of the root principal if the cell does not have it yet: the first
    /// credential of a new cell (make one with `cellog auth token new` on an existing cell, or any 32+ random
    /// characters).
    #[arg(long, env = "CELLOG_ROOT_TOKEN_FILE")]
    root_token_file: Option<PathBuf>,
    /// A file holding the token this node's mirrors present to their sources' cells (a principal's there with a
    /// mirror grant on each stream mirrored: `cellog auth principal mirror`); the node's CA (--tls-ca) verifies those
    /// cells' nodes.
    #[arg(long, env = "CELLOG_MIRROR_TOKEN_FILE")]
    mirror_token_file: Option<PathBuf>,
    /// The cell CA's certificate (PEM; with --tls-cert and --tls-key): mutual TLS on the client and peer ports.
    #[arg(long, env = "CELLOG_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM), signed by the CA (`cellog certs issue node`).
    #[arg(long, env = "CELLOG_TLS_CERT", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// This node's key (PEM).
    #[arg(long, env = "CELLOG_TLS_KEY", requires_all = ["tls_ca", "tls_cert"])]
    tls_key: Option<PathBuf>,
}

/// The same settings in a file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    cell: Option<String>,
    data_dir: Option<PathBuf>,
    client_addr: Option<SocketAddr>,
    raft_addr: Option<SocketAddr>,
    #[serde(alias = "metrics_addr")]
    http_addr: Option<String>,
    advertise_client_addr: Option<String>,
    advertise_raft_addr: Option<String>,
    #[serde(default)]
    peers: Vec<String>,
    bootstrap: Option<bool>,
    heartbeat_ms: Option<u64>,
    election_timeout_ms: Option<u64>,
    snapshot_every: Option<u64>,
    snapshot_every_mib: Option<u64>,
    keep_log_mib: Option<u64>,
    #[serde(default)]
    homes: Vec<String>,
    #[serde(default)]
    home_cas: Vec<String>,
    insecure: Option<bool>,
    principal_rate: Option<u32>,
    principal_burst: Option<u32>,
    tenant_rate: Option<u32>,
    tenant_burst: Option<u32>,
    cell_rate: Option<u32>,
    cell_burst: Option<u32>,
    subject_rate: Option<u32>,
    subject_burst: Option<u32>,
    max_connections: Option<usize>,
    max_calls_per_connection: Option<u32>,
    max_subscriptions: Option<usize>,
    max_subscriptions_per_principal: Option<usize>,
    min_free_disk_mib: Option<u64>,
    max_request_mib_in_flight: Option<u64>,
    request_timeout_ms: Option<u64>,
    keepalive_ms: Option<u64>,
    root_token_file: Option<PathBuf>,
    mirror_token_file: Option<PathBuf>,
    metrics_token_file: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a literal address")
}

/// A `CELL=VALUE` item (`what` it is, and an `example` for the error) as its cell, checked, and its value.
fn cell_item<'a>(item: &'a str, what: &str, example: &str) -> anyhow::Result<(&'a str, &'a str)> {
    let (cell, value) = item
        .split_once('=')
        .map(|(cell, value)| (cell.trim(), value.trim()))
        .filter(|(cell, value)| !cell.is_empty() && !value.is_empty())
        .with_context(|| format!("{what} {item:?}: expected {example}"))?;
    cellog_core::subject::validate_name(cell)
        .map_err(|reason| anyhow::anyhow!("{what} {item:?}: cell name {reason}"))?;
    Ok((cell, value))
}

/// `CELL=ADDR` items as cell → addresses.
fn parse_homes(items: &[String]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut homes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in items {
        let (cell, addr) = cell_item(item, "home", "CELL=CLIENT_ADDR, e.g. bravo=10.0.0.7:7401")?;
        homes.entry(cell.to_string()).or_default().push(addr.to_string());
    }
    Ok(homes)
}

/// Where other cells are reached for sealed mail, and the CAs of those that serve TLS.
#[derive(Clone, Debug, Default)]
pub(crate) struct Homes {
    addrs: BTreeMap<String, Vec<String>>,
    cas: BTreeMap<String, Vec<u8>>,
}

/// `CELL=PATH` items as cell → the CA certificate read from PATH.
fn parse_home_cas(items: &[String]) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut cas = BTreeMap::new();
    for item in items {
        let (cell, path) = cell_item(item, "home CA", "CELL=PATH, e.g. bravo=/etc/cellog/bravo-ca.pem")?;
        let pem = read_bounded(std::path::Path::new(path), MAX_SECRET_BYTES)
            .with_context(|| format!("reading the CA of cell {cell}"))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            bail!("home CA {item:?}: {path} holds no PEM certificate");
        }
        if cas.insert(cell.to_string(), pem).is_some() {
            bail!("home CA {item:?}: cell {cell} is given two CAs");
        }
    }
    Ok(cas)
}

/// Most bytes of a config file.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Most bytes of a token file or a CA certificate file.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// A file's bytes, refused (not read to the end) when it holds more than `most`: a path that names a device or a
/// runaway file must not take the node's memory.
fn read_bounded(path: &std::path::Path, most: u64) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(most + 1).read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > most {
        bail!("{} holds more than {most} bytes", path.display());
    }
    Ok(bytes)
}

/// A file's text, bounded as [`read_bounded`].
fn read_text_bounded(path: &std::path::Path, most: u64) -> anyhow::Result<String> {
    String::from_utf8(read_bounded(path, most)?).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

impl NodeArgs {
    fn resolve(self) -> anyhow::Result<(NodeConfig, Homes)> {
        let file = match &self.config {
            Some(path) => {
                let text = read_text_bounded(path, MAX_CONFIG_BYTES)?;
                toml::from_str::<FileConfig>(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        self.resolve_with(file)
    }

    /// The node's config from these flags over the settings of a file.
    fn resolve_with(self, file: FileConfig) -> anyhow::Result<(NodeConfig, Homes)> {
        let peers = if self.peers.is_empty() { file.peers } else { self.peers };
        let homes = Homes {
            addrs: parse_homes(if self.homes.is_empty() { &file.homes } else { &self.homes })?,
            cas: parse_home_cas(if self.home_cas.is_empty() { &file.home_cas } else { &self.home_cas })?,
        };
        let peers =
            peers.iter().map(|peer| peer.parse::<Peer>()).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
        let old_env = std::env::var("CELLOG_METRICS_ADDR").ok();
        let metrics_addr = match self.http_addr.or(old_env).or(file.http_addr).as_deref() {
            None => Some(addr("127.0.0.1:7601")),
            Some("off" | "none" | "") => None,
            Some(text) => Some(text.parse().with_context(|| format!("HTTP address {text:?}"))?),
        };
        let defaults = RaftTiming::default();
        let root_token = match self.root_token_file.or(file.root_token_file) {
            Some(path) => Some(read_token(&path)?),
            None => None,
        };
        let tls = match (self.tls_ca.or(file.tls_ca), self.tls_cert.or(file.tls_cert), self.tls_key.or(file.tls_key)) {
            (Some(ca), Some(cert), Some(key)) => Some(TlsFiles { ca, cert, key }),
            (None, None, None) => None,
            _ => bail!("TLS needs all of tls_ca, tls_cert and tls_key"),
        };
        let mirrors = MirrorOptions {
            token: match self.mirror_token_file.or(file.mirror_token_file) {
                Some(path) => Some(read_token(&path)?),
                None => None,
            },
            tls: match &tls {
                Some(files) => Some(mirror_tls(&files.ca)?),
                None => None,
            },
            ..MirrorOptions::default()
        };
        let insecure = self.insecure || file.insecure.unwrap_or(false);
        let scrape_token = match self.metrics_token_file.or(file.metrics_token_file) {
            Some(path) => Some(TokenHash(cellog_client::token::hash(&read_token(&path)?))),
            None => None,
        };
        let per_second = self.principal_rate.or(file.principal_rate).unwrap_or(PrincipalRate::DEFAULT.per_second);
        let burst = self.principal_burst.or(file.principal_burst).unwrap_or(per_second.saturating_mul(2));
        let rate = (per_second > 0).then_some(PrincipalRate { per_second, burst: burst.max(1) });
        let most = Limits::DEFAULT;
        // A rate of 0 is no limit; a burst defaults to twice the rate.
        let rate_of = |per_second: Option<u32>, burst: Option<u32>, default: Option<PrincipalRate>| match per_second {
            Some(0) => None,
            Some(per_second) => {
                Some(PrincipalRate { per_second, burst: burst.unwrap_or(per_second.saturating_mul(2)).max(1) })
            }
            None => default.map(|rate| PrincipalRate { burst: burst.unwrap_or(rate.burst).max(1), ..rate }),
        };
        let tenant_rate =
            rate_of(self.tenant_rate.or(file.tenant_rate), self.tenant_burst.or(file.tenant_burst), most.tenant_rate);
        let cell_rate = rate_of(self.cell_rate.or(file.cell_rate), self.cell_burst.or(file.cell_burst), most.cell_rate);
        let subject_rate = rate_of(
            self.subject_rate.or(file.subject_rate),
            self.subject_burst.or(file.subject_burst),
            most.subject_rate,
        );
        let limits = Limits {
            max_connections: self.max_connections.or(file.max_connections).unwrap_or(most.max_connections),
            max_calls_per_connection: self
                .max_calls_per_connection
                .or(file.max_calls_per_connection)
                .unwrap_or(most.max_calls_per_connection),
            max_subscriptions: self.max_subscriptions.or(file.max_subscriptions).unwrap_or(most.max_subscriptions),
            max_subscriptions_per_principal: self
                .max_subscriptions_per_principal
                .or(file.max_subscriptions_per_principal)
                .unwrap_or(most.max_subscriptions_per_principal),
            request_timeout: self
                .request_timeout_ms
                .or(file.request_timeout_ms)
                .map_or(most.request_timeout, Duration::from_millis),
            keepalive: self.keepalive_ms.or(file.keepalive_ms).map_or(most.keepalive, Duration::from_millis),
            min_free_disk_bytes: self
                .min_free_disk_mib
                .or(file.min_free_disk_mib)
                .map_or(most.min_free_disk_bytes, |mib| mib.saturating_mul(1024 * 1024)),
            tenant_rate,
            cell_rate,
            subject_rate,
            max_request_bytes_in_flight: self
                .max_request_mib_in_flight
                .or(file.max_request_mib_in_flight)
                .map_or(most.max_request_bytes_in_flight, |mib| mib.saturating_mul(1024 * 1024)),
        };
        if limits.max_request_bytes_in_flight < Limits::LEAST_REQUEST_BYTES_IN_FLIGHT {
            bail!(
                "max_request_mib_in_flight must hold one largest request: at least {} MiB",
                Limits::LEAST_REQUEST_BYTES_IN_FLIGHT.div_ceil(1024 * 1024)
            );
        }
        if limits.max_connections == 0
            || limits.max_calls_per_connection == 0
            || limits.max_subscriptions == 0
            || limits.max_subscriptions_per_principal == 0
        {
            bail!(
                "max_connections, max_calls_per_connection, max_subscriptions and max_subscriptions_per_principal must \
                 be at least 1"
            );
        }
        if limits.request_timeout.is_zero() || limits.keepalive.is_zero() {
            bail!("request_timeout_ms and keepalive_ms must be at least 1");
        }
        let config = NodeConfig {
            cell: self.cell.or(file.cell).unwrap_or_else(|| "cellog".to_string()),
            id: self.id.or(file.id).unwrap_or(1),
            data_dir: self.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from("cellog-data")),
            client_addr: self.client_addr.or(file.client_addr).unwrap_or_else(|| addr("127.0.0.1:7401")),
            raft_addr: self.raft_addr.or(file.raft_addr).unwrap_or_else(|| addr("127.0.0.1:7501")),
            advertise_client_addr: self.advertise_client_addr.or(file.advertise_client_addr),
            advertise_raft_addr: self.advertise_raft_addr.or(file.advertise_raft_addr),
            metrics_addr,
            peers,
            bootstrap: self.bootstrap.or(file.bootstrap).unwrap_or(true),
            timing: RaftTiming {
                heartbeat_ms: self.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(defaults.heartbeat_ms),
                election_timeout_ms: self
                    .election_timeout_ms
                    .or(file.election_timeout_ms)
                    .unwrap_or(defaults.election_timeout_ms),
                snapshot_every: self.snapshot_every.or(file.snapshot_every).unwrap_or(defaults.snapshot_every),
                snapshot_every_bytes: self
                    .snapshot_every_mib
                    .or(file.snapshot_every_mib)
                    .map_or(defaults.snapshot_every_bytes, |mib| mib.saturating_mul(1024 * 1024)),
                keep_logs: defaults.keep_logs,
                keep_log_bytes: self
                    .keep_log_mib
                    .or(file.keep_log_mib)
                    .map_or(defaults.keep_log_bytes, |mib| mib.saturating_mul(1024 * 1024)),
            },
            mail: None,
            past: Past::Unknown,
            cell_id: None,
            callers: Callers { insecure, cell: None, rate, scrape_token },
            root_token,
            tls,
            limits,
            mirrors,
            apply: ApplyControl { halt_at: self.halt_apply_at, skip: self.skip_entry.iter().copied().collect() },
        };
        check_doors(&config)?;
        if config.peers.iter().any(|peer| peer.id == config.id) {
            bail!("node {} lists itself among its peers", config.id);
        }
        Ok((config, homes))
    }
}

/// Every port over TLS or on loopback: off loopback, calls, Raft messages and HTTP cross a network, so they go over
/// TLS unless the operator says every caller there is trusted (`--insecure`); and `--insecure`, which serves a caller
/// without a credential as root, never combines with TLS, whose point is that callers prove who they are.
fn check_doors(config: &NodeConfig) -> anyhow::Result<()> {
    let insecure = config.callers.insecure;
    if insecure && config.tls.is_some() {
        bail!(
            "--insecure serves callers without a credential as root, which TLS is there to prevent: give the node \
             TLS or --insecure, not both"
        );
    }
    let ports = [("client", Some(config.client_addr)), ("raft", Some(config.raft_addr)), ("HTTP", config.metrics_addr)];
    let exposed = ports.into_iter().find_map(|(port, addr)| Some((port, addr.filter(|a| !a.ip().is_loopback())?)));
    if let Some((port, addr)) = exposed
        && config.tls.is_none()
        && !insecure
    {
        bail!(
            "the {port} address {addr} is not a loopback address: give the node TLS (--tls-ca, --tls-cert, \
             --tls-key; see `cellog certs`), or run it --insecure on a network every caller of which is trusted"
        );
    }
    Ok(())
}

/// A token from its file, checked.
pub(crate) fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = read_text_bounded(path, MAX_SECRET_BYTES).context("reading a token file")?;
    let token = text.trim().to_string();
    cellog_client::token::check(&token).map_err(|reason| anyhow::anyhow!("{}: {reason}", path.display()))?;
    if token.len() < 32 {
        bail!("{}: a token needs at least 32 characters", path.display());
    }
    Ok(token)
}

/// Opens the node's store and starts it, with sealed mail under the cell key in its data directory (made on the first
/// start) and the keyring there.
pub(crate) async fn start(config: &NodeConfig, homes: Homes) -> anyhow::Result<RunningNode<Arc<RocksStorage>>> {
    let (past, cell_id) = cellog_net::node::claim_data_dir(config)?;
    let (key, created) = CellKey::load_or_create(&config.data_dir, &config.cell)?;
    let verb = if created { "made" } else { "found" };
    tracing::info!(fingerprint = %key.fingerprint(), "{verb} the cell key in {}", config.data_dir.join("keys").display());
    let keyring = Keyring::open(&config.data_dir)?;
    let mut config = config.clone();
    config.past = past;
    config.cell_id = cell_id;
    config.mail = Some(MailConfig {
        key,
        keyring,
        keyring_dir: Some(config.data_dir.clone()),
        homes: homes.addrs,
        home_cas: homes.cas,
        retry: RetryPolicy::default(),
        // Envelope ids only need to be unique: a production node seeds them from the system's entropy.
        id_seed: rand::rngs::OsRng.next_u64(),
    });
    let config = &config;
    let store_dir = config.data_dir.join("store");
    let storage = RocksStorage::open(&store_dir).with_context(|| format!("opening {}", store_dir.display()))?;
    let storage = Arc::new(storage);
    let running = RunningNode::start(config, storage, Arc::new(SystemClock)).await?;
    if past != Past::Member {
        tokio::spawn(record_membership(config.clone(), running.node.clone()));
    }
    Ok(running)
}

/// Once this node is a voter of its cell, records so in its data directory's identity: a later start over an empty
/// store is then a lost disk, and the node repairs from a leader before it votes.
async fn record_membership(config: NodeConfig, node: Arc<CellNode<Metered<Arc<RocksStorage>>>>) {
    loop {
        let view = node.cluster_view();
        if view.members.iter().any(|member| member.id == config.id && member.voter) {
            match cellog_net::node::record_membership(&config, node.identity().id()) {
                Ok(()) => {
                    tracing::info!("a voter of cell {:?}: recorded in the data directory's identity", config.cell);
                    return;
                }
                // Tried again: until it is recorded, a lost disk would not be known for one.
                Err(error) => tracing::error!(%error, "cannot record this node's membership in its identity"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `cellog node`.
pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let (config, homes) = args.resolve()?;
    let running = start(&config, homes).await?;
    let failed = tokio::select! {
        () = crate::commands::shutdown_signal() => None,
        reason = running.failed() => Some(reason),
    };
    if let Some(reason) = failed {
        // Exits non-zero so that a supervisor restarts the node into recovery; the stop syncs nothing more.
        let _ = running.stop().await;
        anyhow::bail!("the node stopped: {reason}");
    }
    tracing::info!("stopping: finishing in-flight calls, then syncing");
    running.stop().await.context("syncing the store")?;
    tracing::info!("stopped");
    Ok(())
}

/// TLS toward the cells a node's mirrors follow: their nodes verified by `ca` (the deployment's CA), the node
/// authenticated by its mirror token, not a certificate.
pub(crate) fn mirror_tls(ca: &std::path::Path) -> anyhow::Result<ClientTls> {
    let ca_pem = std::fs::read(ca).with_context(|| format!("reading the CA certificate {}", ca.display()))?;
    Ok(ClientTls { ca_pem, identity: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node's flags with none given.
    fn no_flags() -> NodeArgs {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            node: NodeArgs,
        }
        <Flags as clap::Parser>::parse_from(["cellog"]).node
    }

    /// Fuzz target `config`: a config file's text, parsed and resolved over no flags (without the files it names,
    /// which are the operator's own).
    #[test]
    fn config() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/config");
        cellog_fuzz::fuzz(&corpus, "config", |input| {
            let Ok(mut file) = toml::from_str::<FileConfig>(&String::from_utf8_lossy(input)) else { return };
            (file.root_token_file, file.tls_ca, file.tls_cert, file.tls_key) = (None, None, None, None);
            (file.mirror_token_file, file.metrics_token_file) = (None, None);
            file.home_cas.clear();
            let _ = no_flags().resolve_with(file);
        });
    }

    /// Every port over TLS or on loopback, unless `--insecure`; and `--insecure` never with TLS. Each row: the
    /// client, raft and HTTP addresses, TLS, insecure, and what is refused (a part of the error), or `None`.
    #[test]
    fn every_port_is_over_tls_or_on_loopback_and_insecure_never_with_tls() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").expect("written");
        let (local, open) = ("127.0.0.1:7401", "0.0.0.0:7401");
        // (client, raft, HTTP, TLS, insecure, refused with)
        type Row<'a> = (&'a str, &'a str, &'a str, bool, bool, Option<&'a str>);
        let table: [Row<'_>; 10] = [
            (local, local, "127.0.0.1:7601", false, false, None),
            (local, local, "off", false, false, None),
            (open, local, "127.0.0.1:7601", false, false, Some("the client address 0.0.0.0:7401")),
            (local, "10.0.0.1:7501", "127.0.0.1:7601", false, false, Some("the raft address 10.0.0.1:7501")),
            (local, local, "0.0.0.0:7601", false, false, Some("the HTTP address 0.0.0.0:7601")),
            (local, local, "[::]:7601", false, false, Some("the HTTP address [::]:7601")),
            (open, open, "0.0.0.0:7601", true, false, None),
            (open, open, "0.0.0.0:7601", false, true, None),
            (local, local, "127.0.0.1:7601", true, true, Some("TLS or --insecure, not both")),
            (open, open, "0.0.0.0:7601", true, true, Some("TLS or --insecure, not both")),
        ];
        for (client, raft, http, tls, insecure, refused) in table {
            let mut file = FileConfig {
                client_addr: Some(addr(client)),
                raft_addr: Some(addr(raft.replace("7401", "7501").as_str())),
                http_addr: Some(http.to_string()),
                insecure: Some(insecure),
                ..FileConfig::default()
            };
            if tls {
                (file.tls_ca, file.tls_cert, file.tls_key) = (Some(ca.clone()), Some(ca.clone()), Some(ca.clone()));
            }
            let row = format!("client {client}, raft {raft}, HTTP {http}, TLS {tls}, insecure {insecure}");
            match (no_flags().resolve_with(file), refused) {
                (Ok(_), None) => {}
                (Err(error), Some(part)) => assert!(format!("{error:#}").contains(part), "{row}: {error:#}"),
                (result, _) => panic!("{row}: {:?}", result.map(|_| "started")),
            }
        }
    }

    #[test]
    fn a_config_or_token_file_past_its_bound_is_refused_unread() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).expect("written");
        let error = read_text_bounded(&big, MAX_CONFIG_BYTES).expect_err("too big");
        assert!(error.to_string().contains("holds more than"), "{error:#}");
        assert_eq!(read_text_bounded(&big, MAX_CONFIG_BYTES + 1).expect("fits").len(), MAX_CONFIG_BYTES as usize + 1);
        let error = read_token(std::path::Path::new("/dev/zero")).expect_err("a device is not a token file");
        assert!(format!("{error:#}").contains("holds more than"), "{error:#}");
    }

    #[test]
    fn a_home_ca_names_a_cell_and_a_pem_certificate() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let pem = dir.path().join("bravo-ca.pem");
        std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").expect("written");
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "not a certificate").expect("written");
        let item = |cell: &str, path: &std::path::Path| format!("{cell}={}", path.display());
        let cas = parse_home_cas(&[item("bravo", &pem)]).expect("parsed");
        assert_eq!(cas.keys().collect::<Vec<_>>(), ["bravo"]);
        for bad in [
            vec!["bravo".to_string()],
            vec![item("bra vo", &pem)],
            vec![item("bravo", &dir.path().join("missing"))],
            vec![item("bravo", &garbage)],
            vec![item("bravo", &pem), item("bravo", &pem)],
        ] {
            assert!(parse_home_cas(&bad).is_err(), "{bad:?}");
        }
    }
}
