//! `cellog certs`: a cell's own small PKI. `init` makes the cell's CA; `issue node` and `issue client` make
//! certificates it signs: a node's serves its client and peer ports and dials its peers, a client's names the
//! principal it authenticates as. Keys are ECDSA P-256, written readable by their owner only.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cellog_net::tls::{node_uri, principal_uri};
use clap::Subcommand;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Make a cell's CA in DIR: ca.pem (give it to every node and client) and ca.key (keep it safe).
    Init {
        /// The cell's name: the certificates it signs name nodes and principals of this cell.
        #[arg(long)]
        cell: String,
        /// Where the CA's files go.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
    /// Issue a certificate signed by the CA in DIR.
    #[command(subcommand)]
    Issue(IssueCommand),
    /// Revoke certificates in the cell: calls presenting one are refused on every port from now on. Name the files,
    /// or every certificate DIR's CA issued to a principal or a node (its record, `issued.tsv`).
    Revoke {
        /// Certificate files (PEM).
        files: Vec<PathBuf>,
        /// Every certificate issued to this principal.
        #[arg(long, conflicts_with = "node")]
        principal: Option<String>,
        /// Every certificate issued to this node.
        #[arg(long)]
        node: Option<u64>,
        /// Where the CA and its record of issued certificates are.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        #[command(flatten)]
        connect: crate::Connect,
    },
    /// Renew a node's certificate in place, without a restart: a new certificate for the same node and hosts (and a new
    /// key) replaces the files the node reads, which it serves and dials with within a second; connections already
    /// open go on. The old certificate is kept as node-ID.old.pem, to revoke once every peer uses the new one.
    Rotate {
        /// The node's id in the cell.
        #[arg(long)]
        id: u64,
        /// An address or host name (repeat); by default, those of the certificate it replaces.
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Days the new certificate is valid for, from now.
        #[arg(long, default_value_t = NODE_DAYS, value_parser = clap::value_parser!(u32).range(1..=MAX_DAYS))]
        days: u32,
        /// Where the CA is, and the node's files (node-ID.pem, node-ID.key) unless --cert and --key say otherwise.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The certificate file the node reads (its `tls_cert`).
        #[arg(long, requires = "key")]
        cert: Option<PathBuf>,
        /// The key file the node reads (its `tls_key`).
        #[arg(long, requires = "cert")]
        key: Option<PathBuf>,
    },
    /// The revoked certificates the cell remembers (each until it ends).
    Revoked {
        #[command(flatten)]
        connect: crate::Connect,
    },
}

/// The CA's record of what it issued, one line each: serial (hex), what it names, when it ends (ms since the epoch).
const ISSUED: &str = "issued.tsv";

/// Adds a certificate to the CA's record in `dir`.
fn record(dir: &Path, issued: &Issued) -> anyhow::Result<()> {
    let facts = cellog_net::tls::certificate_facts(issued.cert.as_bytes()).map_err(|error| anyhow::anyhow!(error))?;
    let line = format!("{}\t{}\t{}\n", hex::encode(&facts.serial), facts.names, facts.until_ms);
    let path = dir.join(ISSUED);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    std::io::Write::write_all(&mut file, line.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", path.display()))
}

/// The certificates the CA's record in `dir` says it issued naming `uri`: (serial, names, until).
fn issued_to(dir: &Path, uri: &str) -> anyhow::Result<Vec<(Vec<u8>, String, u64)>> {
    let path = dir.join(ISSUED);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [serial, names, until] = fields[..] else {
            bail!("{} line {} is not SERIAL, NAMES, UNTIL", path.display(), number + 1);
        };
        if names == uri {
            let serial = hex::decode(serial).with_context(|| format!("{} line {}", path.display(), number + 1))?;
            found.push((serial, names.to_string(), until.parse().context("the end of a certificate")?));
        }
    }
    Ok(found)
}

#[derive(Subcommand)]
pub enum IssueCommand {
    /// A node's certificate (node-ID.pem, node-ID.key): its client and peer ports, and its calls to its peers.
    Node {
        /// The node's id in the cell.
        #[arg(long)]
        id: u64,
        /// An address or host name clients and peers reach the node at (repeat).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Days it is valid for, from now.
        #[arg(long, default_value_t = NODE_DAYS, value_parser = clap::value_parser!(u32).range(1..=MAX_DAYS))]
        days: u32,
        /// Where the CA is, and where the files go.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
    /// A client's certificate naming its principal (NAME.pem, NAME.key; a tenant's TENANT/NAME gets TENANT.NAME.pem).
    Client {
        /// The principal it authenticates as (not root, which authenticates by a token that can be revoked).
        #[arg(long)]
        principal: String,
        /// Days it is valid for, from now.
        #[arg(long, default_value_t = CLIENT_DAYS, value_parser = clap::value_parser!(u32).range(1..=MAX_DAYS))]
        days: u32,
        /// Where the CA is, and where the files go.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
}

/// Days a node's certificate is valid for unless told otherwise.
pub const NODE_DAYS: u32 = 365;
/// Days a client's certificate is valid for unless told otherwise: a leaked one ends within a quarter.
pub const CLIENT_DAYS: u32 = 90;
/// Days a cell's CA is valid for: every certificate it signs ends before it does.
pub const CA_DAYS: u32 = 10 * 365;
/// The longest a certificate it signs may be asked to last.
pub const MAX_DAYS: i64 = 5 * 365;

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

fn failed(error: rcgen::Error) -> anyhow::Error {
    anyhow::anyhow!("making a certificate: {error}")
}

/// A new CA for `cell`.
pub fn make_ca(cell: &str) -> anyhow::Result<Issued> {
    cellog_core::subject::validate_name(cell).map_err(|reason| anyhow::anyhow!("cell name {cell:?} {reason}"))?;
    let key = KeyPair::generate().map_err(failed)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    params.distinguished_name.push(DnType::CommonName, format!("cellog CA of cell {cell}"));
    params.distinguished_name.push(DnType::OrganizationName, cell);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    valid_for(&mut params, CA_DAYS);
    let cert = params.self_signed(&key).map_err(failed)?;
    Ok(Issued { cert: cert.pem(), key: key.serialize_pem() })
}

/// Valid from an hour ago (clocks drift) for `days` from now.
fn valid_for(params: &mut CertificateParams, days: u32) {
    #[allow(clippy::disallowed_methods, reason = "a certificate's validity starts at the wall clock's now")]
    let now = time::OffsetDateTime::from(std::time::SystemTime::now());
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A certificate signed by `ca` naming `uri`, for `hosts` (a node) or none (a client), valid for `days`.
fn issue(
    ca: &Issued,
    common_name: &str,
    uri: &str,
    hosts: &[String],
    server: bool,
    days: u32,
) -> anyhow::Result<Issued> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(failed)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(failed)?;
    let key = KeyPair::generate().map_err(failed)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.subject_alt_names.push(SanType::URI(uri.try_into().map_err(failed)?));
    for host in hosts {
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.as_str().try_into().map_err(failed)?),
        };
        params.subject_alt_names.push(san);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    valid_for(&mut params, days);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if server {
        params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    Ok(Issued { cert: cert.pem(), key: key.serialize_pem() })
}

/// Node `id` of `cell`, reached at `hosts`, valid for `days`.
pub fn issue_node(ca: &Issued, cell: &str, id: u64, hosts: &[String], days: u32) -> anyhow::Result<Issued> {
    issue(ca, &format!("node {id} of cell {cell}"), &node_uri(cell, id), hosts, true, days)
}

/// A client authenticating as `principal` of `cell`, valid for `days`. Root gets none: a certificate cannot be
/// revoked before it ends, and root's reach is the whole cell; root authenticates by a token, which can be.
pub fn issue_client(ca: &Issued, cell: &str, principal: &str, days: u32) -> anyhow::Result<Issued> {
    cellog_core::tenant::validate_scoped_name(principal)
        .map_err(|reason| anyhow::anyhow!("principal name {principal:?} {reason}"))?;
    if principal == cellog_core::ROOT {
        bail!(
            "no client certificate for {principal}: it authenticates by a token (`--root-token-file`, then `cellog \
             auth token new root`), which can be revoked; give each operator a principal of its own"
        );
    }
    issue(ca, principal, &principal_uri(cell, principal), &[], false, days)
}

/// Replaces `path` with `contents` whole (written beside it, synced, then renamed over it), readable by its owner only
/// when `secret`: a reader sees the old file or the new one, never half of one.
fn replace(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    let _ = std::fs::remove_file(&staged);
    write_new(&staged, contents, secret)?;
    std::fs::rename(&staged, path).with_context(|| format!("replacing {}", path.display()))
}

/// Renews node `id`'s certificate in the files `cert` and `key` (which the node reads again when they change), for
/// `hosts` (or the old certificate's), valid for `days`; the old certificate is kept as `old`. The key is replaced
/// first: a node that looks between the two renames finds a key of another certificate and keeps the one in use.
pub fn rotate_node(
    dir: &Path,
    id: u64,
    hosts: &[String],
    days: u32,
    (cert, key): (&Path, &Path),
    old: &Path,
) -> anyhow::Result<Issued> {
    let (ca, cell) = load_ca(dir)?;
    let previous = std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
    let hosts = match hosts {
        [] => cellog_net::tls::hosts_of(previous.as_bytes()).map_err(|error| anyhow::anyhow!(error))?,
        given => given.to_vec(),
    };
    if hosts.is_empty() {
        bail!("{} names no host; give them with --host", cert.display());
    }
    let issued = issue_node(&ca, &cell, id, &hosts, days)?;
    replace(old, &previous, false)?;
    replace(key, &issued.key, true)?;
    replace(cert, &issued.cert, false)?;
    record(dir, &issued)?;
    Ok(issued)
}

/// Writes `contents` to `path`, readable by its owner only when `secret`; refuses to overwrite.
pub fn write_new(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    let mut file = options.open(path).with_context(|| format!("writing {} (it must not exist yet)", path.display()))?;
    std::io::Write::write_all(&mut file, contents.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", path.display()))
}

/// The CA in `dir` and the cell it is of.
pub fn load_ca(dir: &Path) -> anyhow::Result<(Issued, String)> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (make it with `cellog certs init`)", path.display()))
    };
    let ca = Issued { cert: read("ca.pem")?, key: read("ca.key")? };
    Ok((ca, read("cell")?.trim().to_string()))
}

/// Makes the CA of `cell` in `dir`.
pub fn init(dir: &Path, cell: &str) -> anyhow::Result<Issued> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if dir.join("ca.pem").exists() {
        bail!("{} already holds a CA", dir.display());
    }
    let ca = make_ca(cell)?;
    write_new(&dir.join("ca.key"), &ca.key, true)?;
    write_new(&dir.join("ca.pem"), &ca.cert, false)?;
    write_new(&dir.join("cell"), &format!("{cell}\n"), false)?;
    Ok(ca)
}

pub async fn run(command: CertsCommand) -> anyhow::Result<()> {
    match command {
        CertsCommand::Init { cell, dir } => {
            init(&dir, &cell)?;
            println!(
                "the CA of cell {cell} is in {}: give ca.pem to every node and client; keep ca.key safe",
                dir.display()
            );
        }
        CertsCommand::Issue(IssueCommand::Node { id, hosts, days, dir }) => {
            let (ca, cell) = load_ca(&dir)?;
            let issued = issue_node(&ca, &cell, id, &hosts, days)?;
            write_new(&dir.join(format!("node-{id}.key")), &issued.key, true)?;
            write_new(&dir.join(format!("node-{id}.pem")), &issued.cert, false)?;
            record(&dir, &issued)?;
            println!("node {id} of cell {cell}: {}/node-{id}.pem and .key, for {}", dir.display(), hosts.join(", "));
        }
        CertsCommand::Issue(IssueCommand::Client { principal, days, dir }) => {
            // A tenant's principal (`TENANT/NAME`) gets files named `TENANT.NAME`.
            let file = principal.replace(cellog_core::tenant::TENANT_SEPARATOR, ".");
            let (ca, cell) = load_ca(&dir)?;
            let issued = issue_client(&ca, &cell, &principal, days)?;
            write_new(&dir.join(format!("{file}.key")), &issued.key, true)?;
            write_new(&dir.join(format!("{file}.pem")), &issued.cert, false)?;
            record(&dir, &issued)?;
            println!("principal {principal} of cell {cell}: {}/{file}.pem and .key", dir.display());
        }
        CertsCommand::Revoke { files, principal, node, dir, connect } => {
            let mut revoking: Vec<(Vec<u8>, String, u64)> = Vec::new();
            for file in &files {
                let pem = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
                let facts = cellog_net::tls::certificate_facts(&pem)
                    .map_err(|error| anyhow::anyhow!("{}: {error}", file.display()))?;
                revoking.push((facts.serial, facts.names, facts.until_ms));
            }
            if principal.is_some() || node.is_some() {
                let (_, cell) = load_ca(&dir)?;
                let uri = match (&principal, node) {
                    (Some(principal), _) => principal_uri(&cell, principal),
                    (None, Some(id)) => node_uri(&cell, id),
                    (None, None) => unreachable!("one is given"),
                };
                let found = issued_to(&dir, &uri)?;
                if found.is_empty() {
                    bail!("{} records no certificate naming {uri}", dir.join(ISSUED).display());
                }
                revoking.extend(found);
            }
            if revoking.is_empty() {
                bail!("name certificate files, or --principal or --node");
            }
            let client = crate::commands::client(&connect)?;
            for (serial, names, until_ms) in revoking {
                let new = client.revoke_certificate(&serial, &names, until_ms).await?;
                let state = if new { "revoked" } else { "was already revoked" };
                println!("certificate {} ({names}) {state}", hex::encode(&serial));
            }
        }
        CertsCommand::Rotate { id, hosts, days, dir, cert, key } => {
            let (cert, key) = match (cert, key) {
                (Some(cert), Some(key)) => (cert, key),
                _ => (dir.join(format!("node-{id}.pem")), dir.join(format!("node-{id}.key"))),
            };
            let old = cert.with_file_name(format!("node-{id}.old.pem"));
            rotate_node(&dir, id, &hosts, days, (&cert, &key), &old)?;
            println!(
                "node {id}'s certificate renewed in {} and {}; the node serves it within a second. Once its peers dial \
                 with it too, revoke the old one: cellog certs revoke {}",
                cert.display(),
                key.display(),
                old.display()
            );
        }
        CertsCommand::Revoked { connect } => {
            let mut table = crate::table::Table::new(["SERIAL", "NAMES", "ENDS (ms since epoch)"]).right([2]);
            for revoked in crate::commands::client(&connect)?.revoked_certificates().await? {
                table.row([hex::encode(&revoked.serial), revoked.subject, revoked.until_ms.to_string()]);
            }
            table.print(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The validity a certificate's PEM gives, as (not before, not after) in seconds since the epoch.
    fn validity(pem: &str) -> (i64, i64) {
        let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("a PEM");
        let cert = der.parse_x509().expect("a certificate");
        (cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp())
    }

    /// Certificates end: a client's after 90 days, a node's after a year, unless told otherwise; the CA after ten
    /// years; and root gets no client certificate at all.
    #[test]
    fn certificates_end_and_root_has_none() {
        let ca = make_ca("prod").expect("a CA");
        let day = 86_400;
        let (ca_from, ca_until) = validity(&ca.cert);
        assert!((ca_until - ca_from - i64::from(CA_DAYS) * day - 3_600).abs() < 60, "the CA lasts ten years");
        // (what, certificate, days it should last)
        let hosts = ["10.0.0.1".to_string()];
        let table = [
            ("a client", issue_client(&ca, "prod", "billing", CLIENT_DAYS).expect("issued"), 90),
            ("a tenant's client", issue_client(&ca, "prod", "acme/ops", 7).expect("issued"), 7),
            ("a node", issue_node(&ca, "prod", 1, &hosts, NODE_DAYS).expect("issued"), 365),
            ("a node for a month", issue_node(&ca, "prod", 2, &hosts, 30).expect("issued"), 30),
        ];
        for (what, issued, days) in table {
            let (from, until) = validity(&issued.cert);
            assert!((until - from - days * day - 3_600).abs() < 60, "{what}: {from}..{until}, not {days} days");
            assert!(until <= ca_until, "{what} ends before its CA");
        }
        let refused = issue_client(&ca, "prod", "root", CLIENT_DAYS).err().expect("no certificate for root");
        assert!(format!("{refused:#}").contains("no client certificate for root"), "{refused:#}");
    }

    /// Rotating a node's certificate replaces its files whole with a new certificate for the same node and hosts and a
    /// new key, keeps the old one beside them, and records both in the CA's record; revoking by node finds both.
    #[test]
    fn a_rotated_node_certificate_keeps_its_hosts_and_is_recorded() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let ca = init(dir.path(), "prod").expect("a CA");
        let hosts = ["10.0.0.7".to_string(), "node-7.example".to_string()];
        let first = issue_node(&ca, "prod", 7, &hosts, NODE_DAYS).expect("issued");
        let (cert, key, old) =
            (dir.path().join("node-7.pem"), dir.path().join("node-7.key"), dir.path().join("node-7.old.pem"));
        write_new(&key, &first.key, true).expect("written");
        write_new(&cert, &first.cert, false).expect("written");
        record(dir.path(), &first).expect("recorded");
        let rotated = rotate_node(dir.path(), 7, &[], 30, (&cert, &key), &old).expect("rotated");
        assert_eq!(std::fs::read_to_string(&cert).expect("read"), rotated.cert);
        assert_eq!(std::fs::read_to_string(&key).expect("read"), rotated.key);
        assert_eq!(std::fs::read_to_string(&old).expect("read"), first.cert);
        assert_ne!(rotated.key, first.key, "a new key");
        let mut kept = cellog_net::tls::hosts_of(rotated.cert.as_bytes()).expect("hosts");
        kept.sort();
        assert_eq!(kept, hosts, "the hosts of the certificate it replaced");
        let (from, until) = validity(&rotated.cert);
        assert!((until - from - 30 * 86_400 - 3_600).abs() < 60);
        let recorded = issued_to(dir.path(), &node_uri("prod", 7)).expect("the record");
        let serials: Vec<Vec<u8>> = recorded.into_iter().map(|(serial, ..)| serial).collect();
        let facts = |pem: &str| cellog_net::tls::certificate_facts(pem.as_bytes()).expect("facts").serial;
        assert_eq!(serials, [facts(&first.cert), facts(&rotated.cert)]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).expect("the key").permissions().mode();
            assert_eq!(mode & 0o077, 0, "the new key is its owner's alone");
        }
    }
}
