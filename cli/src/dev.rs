//! `cellog dev`: a local cell of three nodes (or several cells) on this machine, over TLS with certificates and a root
//! token it makes in its data directory, for trying cellog out.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use cellog_client::{Client, ClientOptions, ClientTls};
use cellog_envelope::CellKey;
use cellog_net::auth::Callers;
use cellog_net::mirror::MirrorOptions;
use cellog_net::tls::TlsFiles;
use cellog_net::{Limits, NodeConfig, Peer, RaftTiming};
use cellog_raft::{ApplyControl, Past};
use rand::RngCore;

use crate::run::{Homes, mirror_tls, read_token, start};

/// The dev cell's root token: read from `path`, or made (random) and written there, readable by its owner only.
fn dev_root_token(path: &std::path::Path) -> anyhow::Result<String> {
    if path.exists() {
        return read_token(path);
    }
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = cellog_client::token::from_random(bytes);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing {}", path.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    Ok(token)
}

/// Where the dev cell's TLS files are.
struct DevCerts {
    dir: PathBuf,
    ca: PathBuf,
}

impl DevCerts {
    /// Node `id` of `cell`: the dev cell's nodes' files are `node-ID`, another cell's `CELL-node-ID`, made on first
    /// use under the same CA.
    fn node(&self, cell: &str, id: u64) -> anyhow::Result<TlsFiles> {
        use crate::commands::certs;
        let stem = if cell == "dev" { format!("node-{id}") } else { format!("{cell}-node-{id}") };
        let (cert, key) = (self.dir.join(format!("{stem}.pem")), self.dir.join(format!("{stem}.key")));
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        if !cert.exists() {
            let (ca, _) = certs::load_ca(&self.dir)?;
            let issued = certs::issue_node(&ca, cell, id, &hosts, certs::NODE_DAYS)?;
            certs::write_new(&key, &issued.key, true)?;
            certs::write_new(&cert, &issued.cert, false)?;
        } else if ends_within(&cert, RENEW_DEV_WITHIN_DAYS)? {
            // A dev cell outlives its certificates: one ending within a month is renewed as the node starts.
            let old = self.dir.join(format!("{stem}.old.pem"));
            certs::rotate_node(&self.dir, id, &hosts, certs::NODE_DAYS, (&cert, &key), &old)?;
        }
        Ok(TlsFiles { ca: self.ca.clone(), cert, key })
    }
}

/// A dev node's certificate ending within this many days is renewed as the node starts.
const RENEW_DEV_WITHIN_DAYS: i64 = 30;

/// Whether the certificate in `path` ends within `days` from now.
fn ends_within(path: &std::path::Path, days: i64) -> anyhow::Result<bool> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let not_after =
        cellog_net::tls::not_after_of(&pem).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    #[allow(clippy::disallowed_methods, reason = "a certificate's end is on the wall clock")]
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    Ok(not_after < i64::try_from(now).unwrap_or(i64::MAX) + days * 86_400)
}

/// The dev cell's CA and its three nodes' certificates (for 127.0.0.1 and localhost) in `dir`, made if missing.
fn dev_certs(dir: &std::path::Path) -> anyhow::Result<DevCerts> {
    use crate::commands::certs;
    let ca_path = dir.join("ca.pem");
    if !ca_path.exists() {
        let ca = certs::init(dir, "dev")?;
        for id in 1..=3 {
            let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
            let issued = certs::issue_node(&ca, "dev", id, &hosts, certs::NODE_DAYS)?;
            certs::write_new(&dir.join(format!("node-{id}.key")), &issued.key, true)?;
            certs::write_new(&dir.join(format!("node-{id}.pem")), &issued.cert, false)?;
        }
    }
    Ok(DevCerts { dir: dir.to_path_buf(), ca: ca_path })
}

/// `cellog dev`.
#[derive(clap::Args, Debug)]
pub struct DevArgs {
    /// Where the nodes keep their data.
    #[arg(long, default_value = ".cellog-dev")]
    data: PathBuf,
    /// Node i serves clients on BASE+i, peers on BASE+100+i and metrics on BASE+200+i; node i of cell dev-K on
    /// BASE+10K+i, BASE+100+10K+i and BASE+200+10K+i.
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    /// Cells besides the dev cell: with N of them, the dev cell is their directory and cells dev-1 to dev-N run
    /// beside it, three nodes each, recorded in it with the dev cell itself (`cellog cells ls`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=9))]
    cells: u16,
}

/// One cell of `cellog dev`: its three nodes' configs.
fn dev_cell(args: &DevArgs, certs: &DevCerts, root_token: &str, k: u16) -> anyhow::Result<Vec<NodeConfig>> {
    let port = |offset: u16| -> anyhow::Result<SocketAddr> {
        let port = args.base_port.checked_add(10 * k + offset).context("--base-port is too high")?;
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    };
    let (cell, data) = match k {
        0 => ("dev".to_string(), args.data.clone()),
        k => (format!("dev-{k}"), args.data.join(format!("dev-{k}"))),
    };
    let mut configs = Vec::new();
    for id in 1..=3u16 {
        configs.push(NodeConfig {
            cell: cell.clone(),
            id: u64::from(id),
            data_dir: data.join(format!("node-{id}")),
            client_addr: port(id)?,
            raft_addr: port(100 + id)?,
            advertise_client_addr: None,
            advertise_raft_addr: None,
            metrics_addr: Some(port(200 + id)?),
            peers: Vec::new(),
            bootstrap: true,
            timing: RaftTiming::default(),
            mail: None,
            past: Past::Unknown,
            cell_id: None,
            callers: Callers::default(),
            root_token: Some(root_token.to_string()),
            tls: Some(certs.node(&cell, u64::from(id))?),
            limits: Limits::DEFAULT,
            // The dev cells share a CA and the root token, so each reaches the others' streams it mirrors.
            mirrors: MirrorOptions {
                token: Some(root_token.to_string()),
                tls: Some(mirror_tls(&certs.ca)?),
                ..MirrorOptions::default()
            },
            apply: ApplyControl::default(),
        });
    }
    let founders: Vec<Peer> = configs.iter().map(|config| Peer { id: config.id, node: config.advertised() }).collect();
    for config in &mut configs {
        config.peers = founders.iter().filter(|peer| peer.id != config.id).cloned().collect();
    }
    // One cell, one key: the first node makes it (or has it), and the others get a copy before they start.
    let (key, _) = CellKey::load_or_create(&configs[0].data_dir, &configs[0].cell)?;
    for config in &configs[1..] {
        key.store(&config.data_dir).with_context(|| format!("giving node {} the cell key", config.id))?;
    }
    Ok(configs)
}

/// `cellog dev`: three nodes of cell "dev" on loopback in this process, and with `--cells N` the cells it is the
/// directory of.
pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    // The root token every client command of this directory uses by default (see `cellog auth`).
    let token_path = args.data.join("root.token");
    let root_token = dev_root_token(&token_path)?;
    // The cell's CA and the nodes' certificates, made on the first start: the dev cell runs with TLS on.
    let certs = dev_certs(&args.data.join("certs"))?;
    let mut cells = Vec::new();
    for k in 0..=args.cells {
        cells.push(dev_cell(&args, &certs, &root_token, k)?);
    }
    // Client commands run here use the dev CA and root token for these addresses, whichever cell they name.
    let listed: String = cells.iter().flatten().map(|config| format!("{}\n", config.client_addr)).collect();
    let name = std::path::Path::new(crate::commands::DEV_SERVERS_FILE).file_name().expect("a file name");
    std::fs::write(args.data.join(name), listed).context("listing the dev nodes' client addresses")?;
    // Started together, so that no node asks for votes of one that is not listening yet (each such refusal would
    // be logged as an error on every first start).
    let nodes = futures::future::try_join_all(cells.iter().flatten().map(|config| async move {
        start(config, Homes::default()).await.with_context(|| format!("starting node {} of {}", config.id, config.cell))
    }))
    .await?;
    match args.cells {
        0 => println!("cellog dev: a 3-node cell with data under {}", args.data.display()),
        n => println!(
            "cellog dev: a 3-node directory cell and {n} cells beside it, with data under {}",
            args.data.display()
        ),
    }
    for (node, config) in nodes.iter().zip(cells.iter().flatten()) {
        // The dev cell serves TLS on every port, HTTP included, with its nodes' certificates of the dev CA.
        let http = node.metrics_addr.map(|addr| format!("https://{addr}/")).unwrap_or_default();
        let cell = if args.cells == 0 { String::new() } else { format!("{} ", config.cell) };
        println!("  {cell}node {}  client {}  raft {}  http {http}", node.node.id(), node.client_addr, node.raft_addr);
    }
    if let Some(addr) = nodes.first().and_then(|node| node.metrics_addr) {
        println!(
            "console: https://{addr}/console#token={} (JSON API under https://{addr}/v1/, see /v1/openapi.json; \
             the certificate is the dev CA's, {})",
            root_token,
            certs.ca.display()
        );
    }
    let tls = ClientTls { ca_pem: std::fs::read(&certs.ca).context("reading the dev CA")?, identity: None };
    let options = ClientOptions { token: Some(root_token), tls: Some(tls), ..ClientOptions::default() };
    let addrs_of = |configs: &[NodeConfig]| -> Vec<String> {
        configs.iter().map(|config| config.client_addr.to_string()).collect()
    };
    let addrs = addrs_of(&cells[0]);
    let client = Client::new(addrs.clone(), options.clone())?;
    let leader = wait_for_leader(&client).await?;
    // With cells beside it, the directory records itself too: it is a cell like them, which may hold streams and
    // mirrors.
    for (k, configs) in cells.iter().enumerate().filter(|_| args.cells > 0) {
        if k > 0 {
            wait_for_leader(&Client::new(addrs_of(configs), options.clone())?).await?;
        }
        client.put_cell(&configs[0].cell, addrs_of(configs)).await.context("recording a cell in the directory")?;
    }
    println!(
        "ready: leader is node {leader}; try `cellog stream add demo --subjects 'demo.>'` and `cellog pub demo.hello hi` \
         (CELLOG_SERVER={})",
        addrs.join(",")
    );
    let failed = tokio::select! {
        () = crate::commands::shutdown_signal() => None,
        reason = futures::future::select_all(nodes.iter().map(|node| Box::pin(node.failed()))) => Some(reason.0),
    };
    // Whoever read the ready line may be gone by now: a closed stdout must not turn a clean stop into a panic.
    let _ = writeln!(std::io::stdout(), "stopping");
    for node in nodes {
        let stopped = node.stop().await;
        if failed.is_none() {
            stopped.context("syncing a store")?;
        }
    }
    if let Some(reason) = failed {
        anyhow::bail!("a node of the dev cell stopped: {reason}");
    }
    Ok(())
}

/// Waits until the cell has a leader that has committed in its term; returns its id.
pub async fn wait_for_leader(client: &Client) -> anyhow::Result<u64> {
    for _ in 0..600 {
        if let Ok(status) = client.cluster_status().await
            && let Some(leader) = status.leader_id
            && status.applied_index.is_some()
        {
            return Ok(leader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("no leader after 30 s")
}
