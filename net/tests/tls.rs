//! Mutual TLS over real loopback sockets, on a three-node cell under one CA: clients authenticate by certificate (or
//! token) and verify the nodes; a client without a certificate and token, one whose certificate another CA signed,
//! and a plaintext one get nowhere; the nodes reach each other only with certificates naming members of their cell.
//! Sealed mail reaches another cell over TLS, verified with that cell's CA.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cellog_client::proto as v1;
use cellog_client::{Client, ClientError, ClientOptions, ClientTls};
use cellog_envelope::{CellKey, Keyring};
use cellog_mail::{MailConfig, RetryPolicy};
use cellog_net::auth::Callers;
use cellog_net::tls::{TlsFiles, node_uri, principal_uri};
use cellog_net::{NodeConfig, Peer, RaftTiming, RunningNode};
use cellog_raft::storage::SimDisk;
use cellog_raft::{NodeAddrs, SystemClock};
use common::free_addr;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};

const CELL: &str = "tls";

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).expect("a CA").pem();
    Ca { pem, issuer: Issuer::new(params, key) }
}

/// A certificate and key (PEM) signed by `ca`, naming `uri`, valid for 127.0.0.1.
fn issue(ca: &Ca, uri: &str) -> (String, String) {
    issue_with(ca, uri, |_| {})
}

/// The same, with `edit` applied to its parameters.
fn issue_with(ca: &Ca, uri: &str, edit: impl FnOnce(&mut CertificateParams)) -> (String, String) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    edit(&mut params);
    params.distinguished_name.push(DnType::CommonName, uri);
    params.subject_alt_names.push(SanType::URI(uri.try_into().expect("a URI")));
    params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("an address")));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    (params.signed_by(&key, &ca.issuer).expect("signed").pem(), key.serialize_pem())
}

async fn node(
    dir: &std::path::Path,
    ca: &Ca,
    id: u64,
    cert_uri: &str,
    addrs: &[(std::net::SocketAddr, std::net::SocketAddr)],
) -> RunningNode<SimDisk> {
    node_of(CELL, dir, ca, id, cert_uri, addrs, |_| {}).await
}

/// Node `id` of `cell` over TLS under `ca`, its config changed by `edit` (mail, an HTTP port).
async fn node_of(
    cell: &str,
    dir: &std::path::Path,
    ca: &Ca,
    id: u64,
    cert_uri: &str,
    addrs: &[(std::net::SocketAddr, std::net::SocketAddr)],
    edit: impl FnOnce(&mut NodeConfig),
) -> RunningNode<SimDisk> {
    node_of_on(cell, dir, ca, id, cert_uri, addrs, edit, SimDisk::new(id)).await
}

/// [`node_of`] on `disk`.
#[allow(clippy::too_many_arguments)]
async fn node_of_on(
    cell: &str,
    dir: &std::path::Path,
    ca: &Ca,
    id: u64,
    cert_uri: &str,
    addrs: &[(std::net::SocketAddr, std::net::SocketAddr)],
    edit: impl FnOnce(&mut NodeConfig),
    disk: SimDisk,
) -> RunningNode<SimDisk> {
    let (cert, key) = issue(ca, cert_uri);
    let files = TlsFiles {
        ca: dir.join(format!("{cell}-ca.pem")),
        cert: dir.join(format!("{cell}-node-{id}.pem")),
        key: dir.join(format!("{cell}-node-{id}.key")),
    };
    std::fs::write(&files.ca, &ca.pem).expect("written");
    std::fs::write(&files.cert, cert).expect("written");
    std::fs::write(&files.key, key).expect("written");
    let (client_addr, raft_addr) = addrs[id as usize - 1];
    let peers = (1..=addrs.len() as u64)
        .filter(|peer| *peer != id)
        .map(|peer| {
            let (client, raft) = addrs[peer as usize - 1];
            Peer { id: peer, node: NodeAddrs::new(raft.to_string(), client.to_string()) }
        })
        .collect();
    let mut config = NodeConfig {
        cell: cell.to_string(),
        id,
        data_dir: std::env::temp_dir(),
        client_addr,
        raft_addr,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers,
        bootstrap: true,
        timing: RaftTiming { heartbeat_ms: 50, election_timeout_ms: 300, ..RaftTiming::default() },
        mail: None,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: Callers { insecure: false, cell: None, rate: None, scrape_token: None },
        root_token: None,
        tls: Some(files),
        limits: cellog_net::Limits::DEFAULT,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    };
    edit(&mut config);
    RunningNode::start(&config, disk, Arc::new(SystemClock)).await.expect("the node starts")
}

fn client(addrs: &[String], ca_pem: &str, identity: Option<(String, String)>, retry: Duration) -> Client {
    let tls = ClientTls {
        ca_pem: ca_pem.as_bytes().to_vec(),
        identity: identity.map(|(c, k)| (c.into_bytes(), k.into_bytes())),
    };
    let options = ClientOptions { retry_for: retry, tls: Some(tls), ..ClientOptions::default() };
    Client::new(addrs.to_vec(), options).expect("a client")
}

/// Root's client of the cell at `addrs`, by a certificate of `ca` (a test's own CA may issue one), once a leader has
/// applied an entry over TLS.
async fn root_once_formed(addrs: &[String], ca: &Ca) -> Client {
    let root = client(addrs, &ca.pem, Some(issue(ca, &principal_uri(CELL, "root"))), Duration::from_secs(20));
    for _ in 0..400 {
        if root
            .cluster_status()
            .await
            .is_ok_and(|status| !status.leader_addr.is_empty() && status.applied_index.is_some())
        {
            return root;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the cell did not form over TLS");
}

type Addrs = Vec<(std::net::SocketAddr, std::net::SocketAddr)>;

/// Three nodes of [`CELL`] over TLS under `ca`, their (client, peer) addresses, and the client addresses alone.
async fn three_nodes(dir: &std::path::Path, ca: &Ca) -> (Vec<RunningNode<SimDisk>>, Addrs, Vec<String>) {
    let addrs: Addrs = (0..3).map(|_| (free_addr(), free_addr())).collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(node(dir, ca, id, &node_uri(CELL, id), &addrs).await);
    }
    let client_addrs = addrs.iter().map(|(client, _)| client.to_string()).collect();
    (nodes, addrs, client_addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_under_mutual_tls() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let (nodes, addrs, client_addrs) = three_nodes(dir.path(), &cell_ca).await;

    // Root by certificate: the cell forms over TLS between its nodes and answers.
    let root = root_once_formed(&client_addrs, &cell_ca).await;
    assert_eq!(root.who_am_i().await.expect("who").name, "root", "a root certificate names root");
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("root creates a stream");

    let brief = Duration::from_millis(300);
    let refused = |client: Client| async move { client.list_streams().await.expect_err("refused") };
    // No certificate and no token: the TLS handshake succeeds (a token would do), the call does not.
    let anonymous = refused(client(&client_addrs, &cell_ca.pem, None, brief)).await;
    assert_eq!(anonymous.reason(), Some("UNAUTHENTICATED"), "{anonymous}");
    // A certificate of another CA: the handshake fails.
    let other_ca = ca("another CA");
    let stranger = client(&client_addrs, &cell_ca.pem, Some(issue(&other_ca, &principal_uri(CELL, "root"))), brief);
    assert!(stranger.list_streams().await.is_err(), "another CA's certificate is refused");
    // An expired certificate of this CA: the handshake fails.
    let expired = issue_with(&cell_ca, &principal_uri(CELL, "root"), |params| {
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    });
    assert!(client(&client_addrs, &cell_ca.pem, Some(expired), brief).list_streams().await.is_err(), "expired");
    // A certificate of this CA naming a principal of another cell.
    let elsewhere = client(&client_addrs, &cell_ca.pem, Some(issue(&cell_ca, &principal_uri("other", "root"))), brief);
    assert_eq!(refused(elsewhere).await.reason(), Some("UNAUTHENTICATED"));
    // A client that does not trust the cell's CA does not talk to it; nor does a plaintext one.
    assert!(client(&client_addrs, &other_ca.pem, None, brief).list_streams().await.is_err());
    let plaintext = Client::new(client_addrs.clone(), ClientOptions { retry_for: brief, ..ClientOptions::default() })
        .expect("a client");
    assert!(plaintext.cluster_status().await.is_err(), "a TLS port answers no plaintext call");

    // The peer port: a certificate of this CA that names no member of the cell is refused before its message is
    // even read; a member's gets as far as the message (this one is garbage).
    let raft_addr = addrs[0].1.to_string();
    let peer_call =
        |uri: String| peer_vote(&cell_ca, uri, raft_addr.clone(), cellog_proto::raft::RaftMessage::default());
    assert_eq!(
        peer_call(node_uri(CELL, 9)).await.expect_err("refused").code(),
        tonic::Code::PermissionDenied,
        "node 9 is no member"
    );
    assert_eq!(
        peer_call(node_uri("other", 2)).await.expect_err("refused").code(),
        tonic::Code::PermissionDenied,
        "another cell's node"
    );
    assert_eq!(
        peer_call(principal_uri(CELL, "root")).await.expect_err("refused").code(),
        tonic::Code::PermissionDenied,
        "a client certificate"
    );
    assert_eq!(
        peer_call(node_uri(CELL, 2)).await.expect_err("refused").code(),
        tonic::Code::InvalidArgument,
        "a member's garbage is read"
    );
    // A member speaks for itself only: node 2's certificate with a vote naming node 3 as the candidate is refused;
    // the same vote naming node 2 is answered (not granted: its term is long past).
    let forged = vote_message(3);
    let refused = peer_vote(&cell_ca, node_uri(CELL, 2), raft_addr.clone(), forged).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("names node 3 as its sender, but comes from node 2"), "{refused:?}");
    let own = peer_vote(&cell_ca, node_uri(CELL, 2), raft_addr.clone(), vote_message(2)).await;
    assert!(own.is_ok(), "{own:?}");
    assert!(root.list_streams().await.is_ok(), "the cell goes on");
    for node in nodes {
        node.stop().await.expect("stops");
    }
}

/// A revoked certificate is refused from the next entry on, on the client port (its call writes nothing) and on the
/// peer port, while another certificate of the same principal goes on working; only a cluster admin revokes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_on_every_port() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let addrs = vec![(free_addr(), free_addr())];
    let node = node(dir.path(), &cell_ca, 1, &node_uri(CELL, 1), &addrs).await;
    let client_addrs = vec![addrs[0].0.to_string()];
    let root = root_once_formed(&client_addrs, &cell_ca).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let grants =
        v1::Grants { publish: vec!["orders.>".into()], subscribe: vec!["orders.>".into()], ..Default::default() };
    root.put_principal("alice", grants).await.expect("alice");

    let (leaked, kept) =
        (issue(&cell_ca, &principal_uri(CELL, "alice")), issue(&cell_ca, &principal_uri(CELL, "alice")));
    let brief = Duration::from_millis(300);
    let alice = client(&client_addrs, &cell_ca.pem, Some(leaked.clone()), brief);
    let alice_too = client(&client_addrs, &cell_ca.pem, Some(kept), brief);
    let message = |n: u32| v1::PublishRequest {
        subject: format!("orders.{n}"),
        payload: bytes::Bytes::from_static(b"x"),
        ..Default::default()
    };
    alice.publish(message(1)).await.expect("alice publishes");
    let facts = cellog_net::tls::certificate_facts(leaked.0.as_bytes()).expect("facts");
    assert_eq!(facts.names, principal_uri(CELL, "alice"));
    let refused = alice.revoke_certificate(&facts.serial, &facts.names, facts.until_ms).await.expect_err("not hers");
    assert_eq!(refused.reason(), Some("PERMISSION_DENIED"), "{refused}");
    assert!(root.revoke_certificate(&facts.serial, &facts.names, facts.until_ms).await.expect("revoked"));
    assert!(!root.revoke_certificate(&facts.serial, &facts.names, facts.until_ms).await.expect("again"));

    let refused = alice.publish(message(2)).await.expect_err("revoked");
    assert_eq!(refused.reason(), Some("UNAUTHENTICATED"), "{refused}");
    assert!(refused.to_string().contains("revoked"), "{refused}");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 1, "the refused call wrote nothing");
    alice_too.publish(message(3)).await.expect("her other certificate still works");
    let listed = root.revoked_certificates().await.expect("listed");
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].serial.to_vec(), listed[0].until_ms), (facts.serial.clone(), facts.until_ms));

    // The peer port: a member's certificate gets as far as the message until it is revoked.
    let raft_addr = addrs[0].1.to_string();
    let (cert, key) = issue(&cell_ca, &node_uri(CELL, 1));
    let member = cellog_net::tls::certificate_facts(cert.as_bytes()).expect("facts");
    let vote = |cert: String, key: String| {
        peer_vote_as(&cell_ca, (cert, key), raft_addr.clone(), cellog_proto::raft::RaftMessage::default())
    };
    let read = vote(cert.clone(), key.clone()).await.expect_err("garbage");
    assert_eq!(read.code(), tonic::Code::InvalidArgument, "{read:?}");
    root.revoke_certificate(&member.serial, &member.names, member.until_ms).await.expect("revoked");
    let refused = vote(cert, key).await.expect_err("revoked");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("revoked"), "{refused:?}");
    root.list_streams().await.expect("the cell goes on");
    node.stop().await.expect("stops");
}

/// The serial of the certificate the TLS port at `addr` presents to a new connection (verified against `ca_pem`).
async fn served_serial(addr: &str, ca_pem: &str) -> Vec<u8> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("a CA certificate")).expect("added");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connected");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("a name");
    let tls = connector.connect(name, tcp).await.expect("a handshake");
    let cert = tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec();
    cellog_net::tls::serial_of(&cert).expect("a serial")
}

/// A node's certificate rotated in place is served to the next handshake without a restart, a client connected
/// before goes on, and the node dials its peers with the new one: with the old one revoked, the cell still commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_and_dialed_with_without_a_restart() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let (nodes, addrs, client_addrs) = three_nodes(dir.path(), &cell_ca).await;
    let root = root_once_formed(&client_addrs, &cell_ca).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let message = |n: u32| v1::PublishRequest {
        subject: format!("orders.{n}"),
        payload: bytes::Bytes::from_static(b"x"),
        ..Default::default()
    };
    root.publish(message(0)).await.expect("published");

    // The leader's files are replaced as `cellog certs rotate` does: the key, then the certificate, each renamed over.
    let leader = root.cluster_status().await.expect("status").leader_id.expect("a leader");
    let (client_addr, raft_addr) = (addrs[leader as usize - 1].0.to_string(), addrs[leader as usize - 1].1.to_string());
    let cert_path = dir.path().join(format!("{CELL}-node-{leader}.pem"));
    let old = std::fs::read(&cert_path).expect("the old certificate");
    let old = cellog_net::tls::certificate_facts(&old).expect("facts");
    assert_eq!(served_serial(&client_addr, &cell_ca.pem).await, old.serial);
    let (cert, key) = issue(&cell_ca, &node_uri(CELL, leader));
    for (path, contents) in [(dir.path().join(format!("{CELL}-node-{leader}.key")), key), (cert_path, cert.clone())] {
        let staged = path.with_extension("new");
        std::fs::write(&staged, contents).expect("written");
        std::fs::rename(&staged, &path).expect("renamed");
    }
    let new = cellog_net::tls::certificate_facts(cert.as_bytes()).expect("facts");
    let mut served = Vec::new();
    for _ in 0..50 {
        served = served_serial(&client_addr, &cell_ca.pem).await;
        if served == new.serial {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(served, new.serial, "the client port serves the rotated certificate");
    assert_eq!(served_serial(&raft_addr, &cell_ca.pem).await, new.serial, "so does the peer port");
    root.publish(message(1)).await.expect("a client connected before goes on");

    // Revoke the old certificate: were the leader still dialing its followers with it, they would refuse it, and
    // nothing would commit.
    root.revoke_certificate(&old.serial, &old.names, old.until_ms).await.expect("revoked");
    for n in 2..5 {
        root.publish(message(n)).await.expect("the leader dials with its new certificate");
    }
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 5);
    for node in nodes {
        node.stop().await.expect("stops");
    }
}

/// A vote request framed for cell [`CELL`], naming `candidate`, at term 0.
fn vote_message(candidate: u64) -> cellog_proto::raft::RaftMessage {
    let request = openraft::raft::VoteRequest::<u64>::new(openraft::Vote::new(0, candidate), None);
    let frame =
        cellog_raft::network::frame_message(&cellog_raft::network::CellIdentity::new(CELL), &request).expect("framed");
    cellog_proto::raft::RaftMessage {
        cell: frame.cell,
        crc32c: frame.crc32c,
        payload: frame.payload,
        cell_id: Default::default(),
    }
}

/// `message` as a vote to the peer port at `raft_addr`, from a certificate of `ca` naming `uri`.
async fn peer_vote(
    ca: &Ca,
    uri: String,
    raft_addr: String,
    message: cellog_proto::raft::RaftMessage,
) -> Result<tonic::Response<cellog_proto::raft::RaftMessage>, tonic::Status> {
    peer_vote_as(ca, issue(ca, &uri), raft_addr, message).await
}

/// `message` as a vote to the peer port at `raft_addr`, with `identity` (a certificate and key).
async fn peer_vote_as(
    ca: &Ca,
    identity: (String, String),
    raft_addr: String,
    message: cellog_proto::raft::RaftMessage,
) -> Result<tonic::Response<cellog_proto::raft::RaftMessage>, tonic::Status> {
    let (cert, key) = identity;
    let ca_pem = ca.pem.clone();
    {
        {
            use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .identity(Identity::from_pem(cert, key));
            let channel = Endpoint::from_shared(format!("https://{raft_addr}"))
                .expect("an endpoint")
                .tls_config(tls)
                .expect("a TLS config")
                .connect()
                .await
                .expect("connected");
            let mut raft = cellog_proto::raft::raft_client::RaftClient::new(channel);
            raft.vote(message).await
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_reaches_a_cell_under_tls_verified_by_its_ca() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (alpha, bravo) = (CellKey::generate("alpha").expect("a key"), CellKey::generate("bravo").expect("a key"));
    let keyring = |own: &CellKey, other: &CellKey| {
        let mut keyring = Keyring::in_memory();
        keyring.import(other.public_armored().as_bytes(), Some(own)).expect("a key imports");
        keyring
    };
    let retry = RetryPolicy {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
        give_up_after: Duration::from_secs(20),
        attempt_timeout: Duration::from_millis(1000),
        poll: Duration::from_millis(50),
    };
    let mail = |key: &CellKey, keyring: Keyring, homes: Vec<(String, String)>, home_cas| MailConfig {
        key: key.clone(),
        keyring,
        keyring_dir: None,
        homes: homes.into_iter().map(|(cell, addr)| (cell, vec![addr])).collect(),
        home_cas,
        retry: retry.clone(),
        id_seed: 3,
    };
    // Root of `cell` by certificate, at its one node's client address.
    let root_of = |cell: &str, ca: &Ca, addrs: &[(std::net::SocketAddr, std::net::SocketAddr)]| {
        let identity = Some(issue(ca, &principal_uri(cell, "root")));
        client(&[addrs[0].0.to_string()], &ca.pem, identity, Duration::from_secs(20))
    };
    // bravo serves over TLS under its own CA; alpha is told that CA for bravo.
    let bravo_ca = ca("bravo's CA");
    let bravo_addrs = [(free_addr(), free_addr())];
    let bravo_mail = mail(&bravo, keyring(&bravo, &alpha), Vec::new(), BTreeMap::new());
    let bravo_node = node_of("bravo", dir.path(), &bravo_ca, 1, &node_uri("bravo", 1), &bravo_addrs, |config| {
        config.mail = Some(bravo_mail)
    })
    .await;
    let bravo_root = root_of("bravo", &bravo_ca, &bravo_addrs);
    let alpha_ca = ca("alpha's CA");
    let alpha_addrs = [(free_addr(), free_addr())];
    let homes = vec![("bravo".to_string(), bravo_addrs[0].0.to_string())];
    let home_cas = BTreeMap::from([("bravo".to_string(), bravo_ca.pem.as_bytes().to_vec())]);
    let alpha_mail = mail(&alpha, keyring(&alpha, &bravo), homes, home_cas);
    let alpha_node = node_of("alpha", dir.path(), &alpha_ca, 1, &node_uri("alpha", 1), &alpha_addrs, |config| {
        config.mail = Some(alpha_mail)
    })
    .await;
    let alpha_root = root_of("alpha", &alpha_ca, &alpha_addrs);

    let sent = alpha_root
        .send_sealed(&["bravo".to_string()], bytes::Bytes::from_static(b"over TLS"), None)
        .await
        .expect("sent");
    let mut delivered = None;
    for _ in 0..200 {
        let status = alpha_root.delivery_status(&sent.envelope_id).await.expect("a status");
        if status.pending == 0 {
            delivered = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = delivered.expect("the delivery settled");
    assert_eq!(status.delivered, 1, "{status:?}");
    let inbox = bravo_root.read_mail(0, 10).await.expect("bravo reads its inbox");
    assert_eq!((inbox.len(), &inbox[0].payload[..]), (1, &b"over TLS"[..]));
    for node in [alpha_node, bravo_node] {
        node.stop().await.expect("stops");
    }
}

/// One HTTP/1.1 request over TLS (verified with `ca_pem`) to `addr`, its status and body.
async fn https(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("a CA")).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connected");
    let server = ServerName::IpAddress(addr.ip().into());
    let mut tls =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server, stream).await.expect("a handshake");
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: cellog\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("sent");
    // A refused call may answer before it reads the body, and close: what it wrote is what counts.
    let _ = tls.write_all(body.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    (status, body)
}

/// The HTTP port of a node with TLS: HTTPS with the node's certificate and nothing in plaintext; every route but
/// the console's page and the OpenAPI document needs a credential, checked before the body is read; `/metrics`
/// answers a cluster admin or the scrape token, and the scrape token opens nothing else. Refused calls write
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_under_tls_serves_https_to_credentials_only() {
    const SCRAPE: &str = "cellog_the-scrape-token-of-this-test-000000000000";
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let addrs = [(free_addr(), free_addr())];
    let http = free_addr();
    let node = node_of(CELL, dir.path(), &cell_ca, 1, &node_uri(CELL, 1), &addrs, |config| {
        config.metrics_addr = Some(http);
        config.callers.scrape_token = Some(cellog_core::TokenHash(cellog_client::token::hash(SCRAPE)));
    })
    .await;
    let root = root_once_formed(&[addrs[0].0.to_string()], &cell_ca).await;
    let grants = v1::Grants { publish: vec![">".into()], admin: true, ..Default::default() };
    root.put_principal("ops", grants).await.expect("a principal");
    let ops = cellog_client::token::from_random([7; 32]);
    root.add_token("ops", cellog_client::token::hash(&ops)).await.expect("its token");

    // Plaintext to the HTTPS port gets no HTTP answer.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut plain = tokio::net::TcpStream::connect(http).await.expect("connected");
        plain.write_all(b"GET /metrics HTTP/1.1\r\nHost: cellog\r\nConnection: close\r\n\r\n").await.expect("sent");
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer).await;
        assert!(!answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    }

    let stream = r#"{"name": "orders", "config": {"subjects": ["orders.>"]}}"#;
    let huge = format!(r#"{{"name": "orders", "pad": "{}"}}"#, "x".repeat(4 << 20));
    // (method, path, token, body, status)
    let table: Vec<(&str, &str, Option<&str>, &str, u16)> = vec![
        ("GET", "/console", None, "", 200),
        ("GET", "/v1/openapi.json", None, "", 200),
        ("GET", "/console/overview", None, "", 401),
        ("GET", "/metrics", None, "", 401),
        ("GET", "/metrics", Some("cellog_nobody-knows-this-token-0000000000000000"), "", 401),
        ("GET", "/metrics", Some(&ops), "", 403),
        ("GET", "/metrics", Some(SCRAPE), "", 200),
        ("GET", "/v1/streams", Some(SCRAPE), "", 401),
        ("POST", "/v1/streams", None, stream, 401),
        ("POST", "/v1/streams", Some(SCRAPE), stream, 401),
        ("POST", "/v1/streams", None, &huge, 401),
        ("GET", "/v1/streams/orders/tail", None, "", 401),
        ("GET", "/v1/streams", Some(&ops), "", 200),
    ];
    for (method, path, token, body, status) in table {
        let (got, answer) = https(http, &cell_ca.pem, method, path, token, body).await;
        let shown: String = answer.chars().take(300).collect();
        assert_eq!(got, status, "{method} {path} with {token:?}: {shown}");
    }
    assert!(root.list_streams().await.expect("streams").is_empty(), "a refused call wrote nothing");
    let (created, answer) = https(http, &cell_ca.pem, "POST", "/v1/streams", Some(&ops), stream).await;
    assert_eq!(created, 200, "{answer}");
    assert_eq!(root.list_streams().await.expect("streams").len(), 1);
    node.stop().await.expect("stops");
}

/// A TLS connection to `addr` verified with `ca_pem`, offering `alpn`.
async fn tls_to(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("a CA")).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connected");
    let server = ServerName::IpAddress(addr.ip().into());
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server, stream).await.expect("a handshake")
}

/// A `PublishBatch` call on the client port at `addr` whose one message declares `declared` bytes and sends `sent` of
/// them, then waits: what a slow (or hostile) sender leaves the node holding. Held while the returned handles live.
async fn partial_grpc_publish(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    token: &str,
    declared: u32,
    sent: usize,
) -> (h2::client::SendRequest<bytes::Bytes>, h2::SendStream<bytes::Bytes>, tokio::task::JoinHandle<()>) {
    let tls = tls_to(addr, ca_pem, b"h2").await;
    let (sender, connection) = h2::client::handshake(tls).await.expect("an HTTP/2 connection");
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.expect("ready");
    let request = http::Request::post(format!("https://{addr}/cellog.v1.Cellog/PublishBatch"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("a request");
    let (_answer, mut body) = sender.send_request(request, false).expect("sent");
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    let mut data = bytes::BytesMut::from(&prefix[..]);
    data.resize(5 + sent, 0);
    let mut data = data.freeze();
    while !data.is_empty() {
        body.reserve_capacity(data.len());
        let capacity = std::future::poll_fn(|cx| body.poll_capacity(cx)).await.expect("capacity").expect("open");
        let chunk = data.split_to(capacity.min(data.len()));
        body.send_data(chunk, false).expect("data sent");
    }
    (sender, body, driven)
}

/// The node's budget of request bytes in flight is one for its client port and its HTTP port: a gRPC message sent in
/// part holds its bytes until the call ends, an HTTP body holds its declared length, and a request that would pass
/// the budget is refused as `REQUEST_BYTES` on either port, writing nothing, until the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_bytes_in_flight_are_bounded_across_both_ports() {
    use tokio::io::AsyncWriteExt;
    const MIB: usize = 1024 * 1024;
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let addrs = [(free_addr(), free_addr())];
    let http = free_addr();
    let node = node_of(CELL, dir.path(), &cell_ca, 1, &node_uri(CELL, 1), &addrs, |config| {
        config.metrics_addr = Some(http);
        config.limits.max_request_bytes_in_flight = cellog_net::Limits::LEAST_REQUEST_BYTES_IN_FLIGHT;
    })
    .await;
    let root = root_once_formed(&[addrs[0].0.to_string()], &cell_ca).await;
    let config = v1::StreamConfig {
        subjects: vec!["big.>".into()],
        max_payload_bytes: Some(8 * MIB as u32),
        ..Default::default()
    };
    root.create_stream("big", config).await.expect("a stream");
    let grants = v1::Grants { publish: vec!["big.>".into()], ..Default::default() };
    root.put_principal("loader", grants).await.expect("a principal");
    let loader = cellog_client::token::from_random([9; 32]);
    root.add_token("loader", cellog_client::token::hash(&loader)).await.expect("its token");
    let count = async || root.stream_info("big").await.expect("the stream").messages;
    let payload = vec![b'p'; 6 * MIB];
    let publish = |subject: &str| v1::PublishRequest {
        subject: subject.to_string(),
        payload: payload.clone().into(),
        ..Default::default()
    };

    // An HTTP body of 16 MiB declared and never sent holds 16 MiB: a 6 MiB publish over gRPC does not fit.
    let mut held = tls_to(http, &cell_ca.pem, b"http/1.1").await;
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: cellog\r\nAuthorization: Bearer {loader}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"subject\": \"big.a\"",
        16 * MIB
    );
    held.write_all(head.as_bytes()).await.expect("sent");
    held.flush().await.expect("flushed");
    let mut refused = None;
    for _ in 0..100 {
        match root.publish(publish("big.a")).await {
            Err(error) => {
                refused = Some(error);
                break;
            }
            // The HTTP call may not have reached the door yet.
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let refused = refused.expect("a publish past the budget is refused");
    assert_eq!(refused.reason(), Some("REQUEST_BYTES"), "{refused}");
    let before = count().await;
    assert!(root.publish(publish("big.a")).await.is_err(), "still held");
    assert_eq!(count().await, before, "a refused publish wrote nothing");
    drop(held);
    let mut published = Err(refused);
    for _ in 0..100 {
        published = root.publish(publish("big.a")).await;
        if published.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    published.expect("the budget is given back when the HTTP call ends");
    let after_grpc = count().await;

    // A gRPC message of 15 MiB sent but for its last byte holds them: an HTTP publish of 6 MiB is refused.
    let held = partial_grpc_publish(addrs[0].0, &cell_ca.pem, &loader, 15 * MIB as u32, 15 * MIB - 1).await;
    let body = serde_json::json!({
        "subject": "big.b",
        "payload": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &payload),
    })
    .to_string();
    let (status, answer) = https(http, &cell_ca.pem, "POST", "/v1/messages", Some(&loader), &body).await;
    assert_eq!(status, 429, "{}", answer.chars().take(300).collect::<String>());
    assert!(answer.contains("REQUEST_BYTES"), "{answer}");
    assert_eq!(count().await, after_grpc, "a refused publish wrote nothing");
    drop(held);
    let mut published = false;
    for _ in 0..100 {
        let (status, _) = https(http, &cell_ca.pem, "POST", "/v1/messages", Some(&loader), &body).await;
        if status == 200 {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(published, "the budget is given back when the gRPC call ends");
    assert_eq!(count().await, after_grpc + 1);
    node.stop().await.expect("stops");
}

/// Serves `addr` over TLS with `cert` and `key` as an impostor of a peer would, counting the connections it is dialed
/// (`.0`) and the handshakes that completed (`.1`): a dialer that refuses the certificate completes none.
async fn impostor(
    addr: std::net::SocketAddr,
    cert: &str,
    key: &str,
) -> (Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::atomic::AtomicUsize>, tokio::task::JoinHandle<()>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("a certificate")];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let mut listener = None;
    for _ in 0..50 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(bound) => {
                listener = Some(bound);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let listener = listener.expect("the stopped node's peer port is free again");
    let (dialed, completed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (counted, done) = (dialed.clone(), completed.clone());
    let served = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let (acceptor, done) = (acceptor.clone(), done.clone());
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(stream).await {
                    // The handshake is over on the dialer's side only once its verifier took the certificate, and
                    // HTTP/2 sends its preface at once: wait for a byte of it.
                    use tokio::io::AsyncReadExt;
                    let mut byte = [0u8; 1];
                    if tls.read(&mut byte).await.is_ok_and(|n| n == 1) {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (dialed, completed, served)
}

/// A node dials no peer whose certificate the cell revoked: an impostor holding a revoked member's certificate and
/// key at that member's address gets no completed connection from the leader, while one with a valid certificate of
/// the same member does (so the refusal is the revocation's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dials_no_peer_whose_certificate_is_revoked() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let (mut nodes, addrs, client_addrs) = three_nodes(dir.path(), &cell_ca).await;
    let root = root_once_formed(&client_addrs, &cell_ca).await;
    let leader = root.cluster_status().await.expect("status").leader_id.expect("a leader");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let cert =
        std::fs::read_to_string(dir.path().join(format!("{CELL}-node-{follower}.pem"))).expect("its certificate");
    let key = std::fs::read_to_string(dir.path().join(format!("{CELL}-node-{follower}.key"))).expect("its key");
    let facts = cellog_net::tls::certificate_facts(cert.as_bytes()).expect("facts");
    root.revoke_certificate(&facts.serial, &facts.names, facts.until_ms).await.expect("revoked");
    let stopped = nodes.remove(follower as usize - 1);
    stopped.stop().await.expect("the follower stops");

    let peer_addr = addrs[follower as usize - 1].1;
    let (dialed, completed, served) = impostor(peer_addr, &cert, &key).await;
    for _ in 0..40 {
        if dialed.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(dialed.load(Ordering::SeqCst) >= 1, "the leader dials the member's address");
    assert_eq!(completed.load(Ordering::SeqCst), 0, "and refuses the revoked certificate it is shown");
    served.abort();
    let _ = served.await;

    let (fresh_cert, fresh_key) = issue(&cell_ca, &node_uri(CELL, follower));
    let (_, completed, served) = impostor(peer_addr, &fresh_cert, &fresh_key).await;
    for _ in 0..50 {
        if completed.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(completed.load(Ordering::SeqCst) > 0, "a certificate the cell did not revoke is dialed");
    served.abort();
    for node in nodes {
        node.stop().await.expect("stops");
    }
}

/// A node follows its CA file without a restart: a client certificate of a second CA is refused until the file holds
/// that CA beside the first, and then accepted, while the node's own certificate of the first CA still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_ca_file_is_trusted_without_a_restart() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (old_ca, new_ca) = (ca("the cell's CA"), ca("the cell's next CA"));
    let addrs = vec![(free_addr(), free_addr())];
    let node = node(dir.path(), &old_ca, 1, &node_uri(CELL, 1), &addrs).await;
    let client_addrs = vec![addrs[0].0.to_string()];
    let root = root_once_formed(&client_addrs, &old_ca).await;
    root.put_principal("alice", v1::Grants { publish: vec![">".into()], ..Default::default() }).await.expect("alice");
    let alice = client(&client_addrs, &old_ca.pem, Some(issue(&new_ca, &principal_uri(CELL, "alice"))), Duration::ZERO);
    assert!(alice.list_streams().await.is_err(), "a certificate of a CA the node does not hold is refused");

    let ca_path = dir.path().join(format!("{CELL}-ca.pem"));
    let staged = ca_path.with_extension("new");
    std::fs::write(&staged, format!("{}{}", old_ca.pem, new_ca.pem)).expect("written");
    std::fs::rename(&staged, &ca_path).expect("renamed");
    let mut accepted = false;
    for _ in 0..50 {
        if alice.list_streams().await.is_ok() {
            accepted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(accepted, "the node trusts the CA its file holds now");
    root.list_streams().await.expect("a client of the first CA goes on");
    node.stop().await.expect("stops");
}

/// A follower whose disk falls below its watermark takes no entries (so its store never fills), and a leader left
/// with too few voters with room refuses writes that grow the store as `STORAGE_FULL`, writing nothing; reads go on,
/// and once the disks have room the write that was waiting commits and writes are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_refused_while_too_few_voters_have_disk_room() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cell_ca = ca("the cell's CA");
    let addrs: Addrs = (0..3).map(|_| (free_addr(), free_addr())).collect();
    let disks: Vec<SimDisk> = (1..=3).map(SimDisk::new).collect();
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let disk = disks[id as usize - 1].clone();
        nodes.push(node_of_on(CELL, dir.path(), &cell_ca, id, &node_uri(CELL, id), &addrs, |_| {}, disk).await);
    }
    let client_addrs: Vec<String> = addrs.iter().map(|(client, _)| client.to_string()).collect();
    let root = root_once_formed(&client_addrs, &cell_ca).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let message = |n: u32| v1::PublishRequest {
        subject: format!("orders.{n}"),
        payload: bytes::Bytes::from_static(b"x"),
        msg_id: Some(format!("m-{n}")),
        ..Default::default()
    };
    root.publish(message(0)).await.expect("published");
    let leader = root.cluster_status().await.expect("status").leader_id.expect("a leader");

    // Both followers' disks fall below the watermark (256 MiB by default).
    for id in (1..=3u64).filter(|id| *id != leader) {
        disks[id as usize - 1].set_free_bytes(Some(1024 * 1024));
    }
    // A node reads its free bytes again at most every 250 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let root_cert = issue(&cell_ca, &principal_uri(CELL, "root"));
    let tls =
        ClientTls { ca_pem: cell_ca.pem.as_bytes().to_vec(), identity: Some((root_cert.0.into(), root_cert.1.into())) };
    let brief = ClientOptions {
        retry_for: Duration::from_millis(500),
        attempt_timeout: Duration::from_millis(500),
        retry_backpressure: false,
        tls: Some(tls),
        ..ClientOptions::default()
    };
    let impatient = Client::new(client_addrs.clone(), brief).expect("a client");
    // The first write finds out: its entry reaches no follower, and it waits.
    let waited = impatient.publish(message(1)).await.expect_err("no quorum takes the entry");
    let mut refused = None;
    for n in 2..40 {
        match impatient.publish(message(n)).await {
            Err(error) if error.reason() == Some("STORAGE_FULL") => {
                refused = Some(error);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let refused = refused.unwrap_or_else(|| panic!("writes are refused once the leader knows (first: {waited})"));
    assert!(refused.to_string().contains("below their watermarks"), "{refused}");
    let held = root.stream_info("orders").await.expect("reads go on").messages;
    assert!(held <= 1, "only what committed before the disks filled: {held}");

    // Room again: the waiting write commits, and writes are taken.
    for id in (1..=3u64).filter(|id| *id != leader) {
        disks[id as usize - 1].set_free_bytes(None);
    }
    let mut published = Err(refused);
    for _ in 0..100 {
        published = root.publish(message(100)).await;
        if published.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    published.expect("writes are taken once the disks have room");
    let info = root.stream_info("orders").await.expect("info");
    assert_eq!(info.messages, 3, "the first message, the one that waited, and the last; none of the refused");
    for node in nodes {
        node.stop().await.expect("stops");
    }
}

/// A client with a CA speaking TLS to a plaintext node is told so at once, naming the node, instead of a transport
/// error retried until it gives up. (The other way round the words depend on a race: a node serving TLS closes on
/// the plaintext preface, and the client sees an HTTP/2 protocol error, explained, or a broken pipe, which a network
/// fault gives too; see the client's `protocol_mismatch`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods, reason = "checks that the call was not retried for its whole budget")]
async fn a_tls_client_of_a_plaintext_node_is_told_which() {
    let ca = ca(CELL);
    let retry_for = Duration::from_secs(20);
    let (plain_node, _) = common::one_node("plain").await;
    let plain_addr = plain_node.client_addr.to_string();
    let with_ca = client(std::slice::from_ref(&plain_addr), &ca.pem, None, retry_for);
    let started = std::time::Instant::now();
    for error in [
        with_ca.cluster_status().await.expect_err("TLS to a plaintext node"),
        with_ca.stream_info("orders").await.expect_err("TLS to a plaintext node"),
    ] {
        assert!(
            matches!(&error, ClientError::Protocol { addr, reason }
                if *addr == plain_addr && reason.contains("did not answer TLS; it may serve plaintext")),
            "{error}"
        );
        assert!(!error.outcome_unknown(), "nothing reached the cell");
    }
    assert!(started.elapsed() < retry_for / 2, "told at once, not retried: {:?}", started.elapsed());
}
