//! What the node tests share.
#![allow(dead_code, reason = "each test file uses part of what is shared")]

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use cellog_client::{Client, ClientOptions};
use cellog_net::{NodeConfig, RaftTiming, RunningNode};
use cellog_raft::SystemClock;
use cellog_raft::storage::SimDisk;

/// First port [`free_addr`] tries, and how many after it: below Linux's ephemeral range (32768 and up by default).
const PORTS: (u16, u16) = (20_000, 12_000);

/// A loopback address free now, for a node to bind later, outside the kernel's ephemeral range: a port that bind(0)
/// gave and was released can be taken meanwhile by an outgoing connection (a node already started dialling its
/// peers), and the node given it then fails to bind, or a node dials itself. Each call in a process tries the next
/// port, starting at an offset drawn from the process id, so tests side by side get different ones.
pub fn free_addr() -> SocketAddr {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % u32::from(PORTS.1)) as u16;
    for _ in 0..PORTS.1 {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % PORTS.1;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", PORTS.0 + offset)) {
            return listener.local_addr().expect("a bound listener's address");
        }
    }
    panic!("no free port in {}..{}", PORTS.0, PORTS.0 + PORTS.1);
}

/// A one-node cell on loopback (its disk simulated, in memory) and a client of it, once it leads.
pub async fn one_node(cell: &str) -> (RunningNode<SimDisk>, Client) {
    let any = "127.0.0.1:0".parse().expect("an address");
    let config = NodeConfig {
        cell: cell.to_string(),
        id: 1,
        data_dir: std::env::temp_dir(),
        client_addr: any,
        raft_addr: any,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: Some(any),
        peers: Vec::new(),
        bootstrap: true,
        timing: RaftTiming {
            heartbeat_ms: 50,
            election_timeout_ms: 200,
            snapshot_every: 1000,
            keep_logs: 1000,
            ..RaftTiming::default()
        },
        mail: None,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: cellog_net::auth::Callers { insecure: true, cell: None, rate: None },
        root_token: None,
        tls: None,
        limits: cellog_net::Limits::DEFAULT,
    };
    let node = RunningNode::start(&config, SimDisk::new(7), Arc::new(SystemClock)).await.expect("the node starts");
    let client = Client::new([node.client_addr.to_string()], ClientOptions::default()).expect("a client");
    for _ in 0..200 {
        if client.cluster_status().await.is_ok_and(|status| status.state == "Leader" && status.applied_index.is_some())
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    (node, client)
}

/// The text a node serves on `/metrics`, fetched over plain HTTP/1.1.
pub async fn scrape(metrics_addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(metrics_addr).await.expect("connected");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: cellog\r\nConnection: close\r\n\r\n").await.expect("sent");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}
