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
    one_node_on(cell, SimDisk::new(7)).await
}

/// The same on `disk`, which the test keeps a handle of.
pub async fn one_node_on(cell: &str, disk: SimDisk) -> (RunningNode<SimDisk>, Client) {
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
        callers: cellog_net::auth::Callers { insecure: true, cell: None, rate: None, scrape_token: None },
        root_token: None,
        tls: None,
        limits: cellog_net::Limits::DEFAULT,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    };
    let node = RunningNode::start(&config, disk, Arc::new(SystemClock)).await.expect("the node starts");
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

/// An HTTP answer: status, headers and body.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// Opens an HTTP/1.1 connection to `addr` and sends one request; the answer's body is left to read.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connected");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("an HTTP connection");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder().method(method).uri(path).header("host", "cellog");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::Full::new(bytes::Bytes::from(body))).expect("a request");
    sender.send_request(request).await.expect("an answer")
}

/// One HTTP request with a JSON body (or none), its whole answer read.
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<serde_json::Value>) -> Answer {
    http_with(addr, method, path, &[], body.map(|body| body.to_string().into_bytes()).unwrap_or_default()).await
}

/// The same with headers and a raw body.
pub async fn http_with(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    use http_body_util::BodyExt;
    let answer = http_request(addr, method, path, headers, body).await;
    let status = answer.status().as_u16();
    let headers = answer.headers().clone();
    let body = answer.into_body().collect().await.expect("the body").to_bytes();
    Answer { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

/// The events of a server-sent event stream, read as they come.
pub struct Events {
    body: hyper::body::Incoming,
    buffer: String,
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: serde_json::Value,
}

impl Events {
    /// Opens `path` as an event stream.
    pub async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Events {
        let answer = http_request(addr, "GET", path, headers, Vec::new()).await;
        assert_eq!(answer.status().as_u16(), 200, "{path}");
        let kind = answer.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("");
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        Events { body: answer.into_body(), buffer: String::new() }
    }

    /// The next event (comments skipped), or `None` when the stream ended; fails after ten seconds of waiting.
    pub async fn next(&mut self) -> Option<Event> {
        use http_body_util::BodyExt;
        loop {
            while let Some(cut) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..cut + 2).collect();
                let (mut event, mut id, mut data) = ("message".to_string(), None, String::new());
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event = value.trim().to_string();
                    } else if let Some(value) = line.strip_prefix("id:") {
                        id = Some(value.trim().to_string());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim());
                    }
                }
                if !data.is_empty() {
                    let data = serde_json::from_str(&data).expect("an event's data is JSON");
                    return Some(Event { event, id, data });
                }
            }
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), self.body.frame())
                .await
                .expect("an event within ten seconds");
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                _ => return None,
            }
        }
    }
}
