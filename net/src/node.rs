//! A cellog node: its cell replica under Raft, the client API and the Raft transport on their own addresses, gRPC
//! health and reflection, and Prometheus metrics. [`RunningNode::stop`] shuts it down gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cellog_client::limits::MAX_CLIENT_MESSAGE;
use cellog_core::{Actor, Command, ROOT, TokenHash};
use cellog_mail::{MailConfig, MailService, Mailroom, deliver_loop};
use cellog_proto::raft::raft_server::RaftServer;
use cellog_proto::v1::cellog_server::CellogServer;
use cellog_proto::v1::mail_server::MailServer;
pub use cellog_raft::RaftTiming;
use cellog_raft::network::{CellId, CellIdentity};
use cellog_raft::storage::{Storage, StorageError};
use cellog_raft::{ApplyControl, CellNode, Clock, NodeAddrs, NodeId, Past, StartError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::Callers;
use crate::limits::Limits;
use crate::listen::{BindError, Listeners, Services};
use crate::mail_cell::NodeCell;
use crate::metrics::{Metered, Metrics};
use crate::mirror::{MirrorOptions, mirror_loop};
use crate::service::CellogService;
use crate::tls::{NodeTls, TlsFiles};
use crate::transport::{MAX_RAFT_MESSAGE, RaftService, grpc_network};

/// How long a stopping node waits for in-flight calls before it stops Raft anyway.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Another node of the cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its id.
    pub id: NodeId,
    /// Where it is reached.
    pub node: NodeAddrs,
}

impl std::str::FromStr for Peer {
    type Err = String;

    /// `ID=RAFT_ADDR/CLIENT_ADDR`, e.g. `2=127.0.0.1:7502/127.0.0.1:7402`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("peer {text:?}: expected ID=RAFT_ADDR/CLIENT_ADDR, e.g. 2=127.0.0.1:7502/127.0.0.1:7402");
        let (id, addrs) = text.split_once('=').ok_or_else(bad)?;
        let (raft_addr, client_addr) = addrs.split_once('/').ok_or_else(bad)?;
        let id = id.trim().parse().map_err(|_| bad())?;
        if raft_addr.trim().is_empty() || client_addr.trim().is_empty() {
            return Err(bad());
        }
        Ok(Peer { id, node: NodeAddrs::new(raft_addr.trim(), client_addr.trim()) })
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}/{}", self.id, self.node.raft_addr, self.node.client_addr)
    }
}

/// Everything a node needs to start. (`Debug` shows whether it has a root token, never the token.)
#[derive(Clone)]
pub struct NodeConfig {
    /// The cell's name; nodes refuse Raft messages from another cell.
    pub cell: String,
    /// This node's id in the cell.
    pub id: NodeId,
    /// Where its data lives.
    pub data_dir: PathBuf,
    /// Where it serves clients.
    pub client_addr: SocketAddr,
    /// Where it serves its peers.
    pub raft_addr: SocketAddr,
    /// The client address given to others (default: `client_addr`).
    pub advertise_client_addr: Option<String>,
    /// The peer address given to others (default: `raft_addr`).
    pub advertise_raft_addr: Option<String>,
    /// Where it serves `/metrics`, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// The other founding nodes of the cell.
    pub peers: Vec<Peer>,
    /// Whether to found the cell (itself and `peers`) when its storage is empty. A node that will join an existing
    /// cell as a learner leaves this off.
    pub bootstrap: bool,
    /// Raft timing.
    pub timing: RaftTiming,
    /// The cell key, keyring and other cells' addresses, for sealed mail; `None`: this node has no mail.
    pub mail: Option<MailConfig>,
    /// What the node was, as its data directory's identity says ([`claim_data_dir`]).
    pub past: Past,
    /// The cell's id, as the data directory's identity says, if it says one.
    pub cell_id: Option<CellId>,
    /// How it treats callers without a credential.
    pub callers: Callers,
    /// Mutual TLS on the client and peer ports, under the cell's CA; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// A token this node makes a token of the root principal, if the cell does not have it yet: the first credential
    /// of a new cell.
    pub root_token: Option<String>,
    /// Bounds on connections, calls, subscriptions and call time, and keep-alive.
    pub limits: Limits,
    /// How this node runs its cell's mirrors while it leads: thresholds, backoff, and the credential toward sources.
    pub mirrors: MirrorOptions,
    /// Where to stop applying entries, and which to pass over: the operator's way past an entry that panics on every
    /// replica (see [`cellog_raft::apply_control`]).
    pub apply: ApplyControl,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let NodeConfig {
            cell,
            id,
            data_dir,
            client_addr,
            raft_addr,
            advertise_client_addr,
            advertise_raft_addr,
            metrics_addr,
            peers,
            bootstrap,
            timing,
            mail,
            past,
            cell_id,
            callers,
            tls,
            root_token,
            limits,
            mirrors,
            apply,
        } = self;
        f.debug_struct("NodeConfig")
            .field("cell", cell)
            .field("id", id)
            .field("data_dir", data_dir)
            .field("client_addr", client_addr)
            .field("raft_addr", raft_addr)
            .field("advertise_client_addr", advertise_client_addr)
            .field("advertise_raft_addr", advertise_raft_addr)
            .field("metrics_addr", metrics_addr)
            .field("peers", peers)
            .field("bootstrap", bootstrap)
            .field("timing", timing)
            .field("mail", &mail.as_ref().map(|_| "<mail: the cell key, keyring and homes>"))
            .field("past", past)
            .field("cell_id", cell_id)
            .field("callers", callers)
            .field("tls", tls)
            .field("root_token", &cellog_client::token::redacted(root_token))
            .field("limits", limits)
            .field("mirrors", mirrors)
            .field("apply", apply)
            .finish()
    }
}

impl NodeConfig {
    /// This node as its peers and clients reach it.
    pub fn advertised(&self) -> NodeAddrs {
        self.advertised_at(self.raft_addr, self.client_addr)
    }

    /// This node as its peers and clients reach it, listening where it did bind (port 0 picks a free port).
    fn advertised_at(&self, raft_addr: SocketAddr, client_addr: SocketAddr) -> NodeAddrs {
        NodeAddrs::new(
            self.advertise_raft_addr.clone().unwrap_or_else(|| raft_addr.to_string()),
            self.advertise_client_addr.clone().unwrap_or_else(|| client_addr.to_string()),
        )
    }
}

/// Why a node did not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is unusable.
    #[error("config: {0}")]
    Config(String),
    /// The storage could not be opened.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// Raft did not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The data directory belongs to another node or cell.
    #[error("{0}")]
    Identity(String),
}

/// A started node.
pub struct RunningNode<S> {
    /// The node.
    pub node: Arc<CellNode<Metered<S>>>,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Where it serves clients.
    pub client_addr: SocketAddr,
    /// Where it serves peers.
    pub raft_addr: SocketAddr,
    /// Where it serves metrics.
    pub metrics_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

/// The identity a data directory records: which cell and node it belongs to, whether that node was a voter, and the
/// cell's id once the node knows it.
fn identity(config: &NodeConfig, member: bool, cell_id: Option<CellId>) -> String {
    let member = if member { "member=yes\n" } else { "" };
    let cell_id = cell_id.map_or(String::new(), |id| format!("cell_id={id}\n"));
    format!("cell={}\nnode={}\n{member}{cell_id}", config.cell, config.id)
}

/// Splits the cell id line off an identity: the rest, and the id.
fn split_cell_id(text: &str) -> Result<(String, Option<CellId>), String> {
    let mut rest = String::new();
    let mut cell_id = None;
    for line in text.lines() {
        match line.strip_prefix("cell_id=") {
            Some(hex) => {
                let id = u128::from_str_radix(hex, 16).map_err(|error| format!("cell_id {hex:?}: {error}"))?;
                cell_id = Some(CellId(id));
            }
            None => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    Ok((rest, cell_id))
}

/// Writes the identity file so that a crash leaves the old one or the new one whole: a temporary file, fsynced,
/// renamed over it, and the directory fsynced.
fn write_identity(data_dir: &std::path::Path, text: &str) -> Result<(), NodeError> {
    let (path, temporary) = (data_dir.join("IDENTITY"), data_dir.join("IDENTITY.new"));
    let failed =
        |what: &str, error: std::io::Error| NodeError::Identity(format!("cannot {what} {}: {error}", path.display()));
    let mut file = std::fs::File::create(&temporary).map_err(|error| failed("write", error))?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|error| failed("write", error))?;
    file.sync_all().map_err(|error| failed("sync", error))?;
    std::fs::rename(&temporary, &path).map_err(|error| failed("replace", error))?;
    std::fs::File::open(data_dir).and_then(|dir| dir.sync_all()).map_err(|error| failed("sync the directory of", error))
}

/// Claims the data directory for this node: records its identity on the first start, and refuses a directory that
/// belongs to another node or cell. Returns what the identity says of the node's past ([`Past::Member`] once it was a
/// voter of its cell ([`record_membership`]), so that an empty store then is known for a lost disk) and the cell's id,
/// if it records one.
pub fn claim_data_dir(config: &NodeConfig) -> Result<(Past, Option<CellId>), NodeError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|error| NodeError::Identity(format!("cannot create {}: {error}", config.data_dir.display())))?;
    let path = config.data_dir.join("IDENTITY");
    let unreadable = |reason: String| NodeError::Identity(format!("cannot read {}: {reason}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(found) => {
            let (found, cell_id) = split_cell_id(&found).map_err(unreadable)?;
            if found == identity(config, true, None) {
                Ok((Past::Member, cell_id))
            } else if found == identity(config, false, None) {
                Ok((Past::Unknown, cell_id))
            } else {
                Err(NodeError::Identity(format!(
                    "{} belongs to another node: it holds {:?}, this is {:?}",
                    config.data_dir.display(),
                    found.trim(),
                    identity(config, false, None).trim()
                )))
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            write_identity(&config.data_dir, &identity(config, false, None)).map(|()| (Past::Unknown, None))
        }
        Err(error) => Err(unreadable(error.to_string())),
    }
}

/// Records in the data directory's identity that this node is a voter of its cell, and the cell's id: from then on, a
/// start over an empty store is a lost disk, and the node repairs from a leader before it votes (see [`Past::Member`]),
/// taking entries under that cell id alone.
pub fn record_membership(config: &NodeConfig, cell_id: Option<CellId>) -> Result<(), NodeError> {
    write_identity(&config.data_dir, &identity(config, true, cell_id))
}

impl<S: Storage + Clone> RunningNode<S> {
    /// Starts a node on `storage`: binds its addresses, opens and verifies its storage, starts Raft, founds the cell
    /// if asked to and it is new, and serves.
    pub async fn start(config: &NodeConfig, storage: S, clock: Arc<dyn Clock>) -> Result<Self, NodeError> {
        let raft_config = config.timing.raft_config(&config.cell).map_err(NodeError::Config)?;
        let listeners = Listeners::bind(config.client_addr, config.raft_addr, config.metrics_addr)
            .await
            .map_err(|BindError { addr, error }| NodeError::Bind { addr, error })?;
        let (client_addr, raft_addr, metrics_addr) =
            (listeners.client_addr(), listeners.raft_addr(), listeners.metrics_addr());

        let metrics = Arc::new(Metrics::new());
        let storage = Metered::new(storage, metrics.clone());
        let identity = match config.cell_id {
            Some(id) => CellIdentity::known(config.cell.as_str(), id),
            None => CellIdentity::new(config.cell.as_str()),
        };
        let tls = match &config.tls {
            Some(files) => Some(NodeTls::load(files).map_err(NodeError::Config)?),
            None => None,
        };
        let revoked = crate::transport::Revoked::default();
        let network = grpc_network(identity.clone(), tls.clone(), revoked.clone(), metrics.clone());
        // Only the data directory's identity says a node was a member, and a node whose identity went with its disk
        // cannot tell it is not new. So a founder starting on an empty store votes only once the cell's founder finds
        // every founder holding nothing, and a node joining later (a learner, which catches up before it votes
        // anyway) repairs from the leader first (see `cellog_raft::founding`).
        let past = match config.past {
            Past::Unknown if config.bootstrap => Past::Founding,
            Past::Unknown => Past::Member,
            known => known,
        };
        let node =
            CellNode::start_with(config.id, raft_config, storage, network, clock, past, identity, config.apply.clone())
                .await?;
        node.set_keep_log_bytes(config.timing.keep_log_bytes);
        node.set_snapshot_every_bytes(config.timing.snapshot_every_bytes);
        node.set_min_free_bytes(config.limits.min_free_disk_bytes);
        let node = Arc::new(node);
        revoked.follow(&node);
        if let Some(from) = node.recovery().format_migrated_from {
            tracing::info!("storage format {from} migrated to {}", cellog_raft::STORE_FORMAT);
        }
        if node.recovery().repair_target.is_some() {
            tracing::warn!(recovery = ?node.recovery(), "storage needed repair; catching up from the cell");
        }
        // A node that was a member never founds the cell again: over a lost disk that would start a second cell of
        // the same name with nothing in it. Of the founders, the one with the lowest id founds the cell and makes its
        // id, once no founder holds anything (which a founder that lost its data learns then); the others learn the id
        // from its first entries.
        let founder = config.peers.iter().all(|peer| peer.id > config.id);
        // Not among the tasks a stop waits for: it waits for peers, and ends once the node stops.
        if config.bootstrap && founder && config.past != Past::Member {
            let mut members: std::collections::BTreeMap<NodeId, NodeAddrs> =
                config.peers.iter().map(|peer| (peer.id, peer.node.clone())).collect();
            members.insert(config.id, config.advertised_at(raft_addr, client_addr));
            let node = node.clone();
            tokio::spawn(async move {
                if let Err(error) = node.found_when_no_founder_holds_anything(members).await {
                    tracing::error!(%error, "founding the cell failed");
                }
            });
        }

        let (stop, stopped) = watch::channel(false);
        let mail = config.mail.clone().map(|mail| Arc::new(Mailroom::new(mail, metrics.mail.clone())));
        // With TLS on, a client certificate of the cell's CA names a principal of this cell.
        let callers = Callers { cell: tls.as_ref().map(|_| config.cell.clone()), ..config.callers.clone() };
        let mail_cell = Arc::new(NodeCell(node.clone(), callers.clone()));
        let mut tasks = Vec::new();
        if let Some(mail) = &mail {
            tracing::info!(cell = mail.cell(), "sealed mail on");
            tasks.push(tokio::spawn(deliver_loop(mail.clone(), mail_cell.clone(), stopped.clone())));
        }
        tasks.push(tokio::spawn(mirror_loop(
            node.clone(),
            config.cell.clone(),
            config.mirrors.clone(),
            metrics.mirrors.clone(),
            stopped.clone(),
        )));
        if let Some(token) = &config.root_token {
            let token = TokenHash(cellog_client::token::hash(token));
            tasks.push(tokio::spawn(install_root_token(node.clone(), token, stopped.clone())));
        }
        #[cfg(not(madsim))]
        let client_door = crate::auth::ClientDoor::new(node.clone(), callers.clone());
        let api = CellogService::new(node.clone(), metrics.clone(), callers, &config.limits);
        let client_service = CellogServer::new(api.clone())
            .max_decoding_message_size(MAX_CLIENT_MESSAGE)
            .max_encoding_message_size(MAX_CLIENT_MESSAGE);
        let mail_service = MailServer::new(MailService::new(mail_cell, mail))
            .max_decoding_message_size(MAX_CLIENT_MESSAGE)
            .max_encoding_message_size(MAX_CLIENT_MESSAGE);
        let tls_cell = tls.as_ref().map(|_| config.cell.clone());
        let raft_service = RaftServer::new(RaftService::new(node.clone(), metrics.clone(), tls_cell))
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE);
        let services = Services {
            client: client_service,
            api,
            mail: mail_service,
            raft: raft_service,
            #[cfg(not(madsim))]
            raft_door: crate::transport::PeerDoor::new(node.clone(), tls.as_ref().map(|_| config.cell.clone())),
            #[cfg(not(madsim))]
            client_door,
        };
        let mut servers = listeners
            .serve(services, node.clone(), metrics.clone(), stopped, tls.as_ref(), &config.limits)
            .map_err(NodeError::Config)?;
        servers.extend(tasks);
        tracing::info!(id = config.id, %client_addr, %raft_addr, ?metrics_addr, "node serving");
        Ok(RunningNode { node, metrics, client_addr, raft_addr, metrics_addr, stop, servers })
    }

    /// Resolves with the reason once the node cannot go on: a storage write or fsync failed (the store is poisoned
    /// and Raft stopped), or a panic interrupted applying. By then health says NOT_SERVING and the replica serves no
    /// read. The host stops the node and exits non-zero, so that a supervisor restarts it into recovery.
    pub async fn failed(&self) -> String {
        let reason = self.node.wait_fatal().await;
        tracing::error!(%reason, "this node cannot go on");
        reason
    }

    /// Stops gracefully: stops accepting calls, lets in-flight calls finish (up to [`DRAIN_TIMEOUT`]), stops Raft and
    /// syncs the storage.
    pub async fn stop(self) -> Result<(), StorageError> {
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, futures::future::join_all(self.servers)).await;
        if drained.is_err() {
            tracing::warn!("calls still in flight after {DRAIN_TIMEOUT:?}; stopping anyway");
        }
        self.node.shutdown().await;
        self.node.storage().sync()
    }
}

/// Makes `token` a token of the root principal once this node sees the cell without it: proposed as the node's own
/// command until its replica holds it. Every node given the token tries; the leader's proposal lands, and the others
/// see it applied.
async fn install_root_token<S: Storage + Clone>(
    node: Arc<CellNode<S>>,
    token: TokenHash,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let held = node.replica().map(|replica| replica.cell.authenticate(&Actor::Token(token)).is_ok());
        if held.unwrap_or(true) {
            return;
        }
        match node.propose_now(Command::AddToken { principal: ROOT.to_string(), token }).await {
            Ok(Ok(_)) => {
                tracing::info!(%token, "the root token is installed");
                return;
            }
            Ok(Err(rejection)) => {
                tracing::warn!(%token, %rejection, "the root token was refused");
                return;
            }
            // Not the leader, or no leader yet: the leader's own attempt, or a later one here, lands.
            Err(_) => {}
        }
        // `biased`: polled in this order, never in one drawn at random, so a simulated run repeats.
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stopped.changed() => return,
        }
    }
}
