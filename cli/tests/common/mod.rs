//! Node processes for end-to-end tests: the real `cellog` binary on loopback, each with its own data directory.
#![allow(dead_code)]
#![allow(clippy::disallowed_methods, reason = "end-to-end tests wait on the real clock")]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cellog_client::{Client, ClientOptions};

/// Whether the switch `name` (an environment variable) is on: `1` is on, unset or `0` is off, and any other value is
/// refused, so that a mistyped value cannot skip a test unnoticed.
pub fn switch(name: &str) -> bool {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(value) if value == "0" => false,
        Ok(value) if value == "1" => true,
        other => panic!("{name} is 1 (on) or 0 (off), not {other:?}"),
    }
}

/// A free loopback port for a node process to bind, below the kernel's ephemeral range (32768 and up on Linux): a
/// port the kernel hands out and takes back may be taken again by any outgoing connection before the node binds it,
/// which failed a test with "Address already in use" while others ran beside it. Ports are taken in turn from a
/// place drawn from the process id, so test binaries running at once start apart, and each is checked free.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// A base port for `cellog dev --base-port` whose block (BASE+1 to BASE+299: the clients, peers and metrics of up to
/// ten cells) is taken in the same turn as [`free_port`]'s ports, so that no other test of this binary is handed one
/// of them while the dev cell starts, and is checked free. (The dev tests drew their base from the process id alone,
/// and a node of a test beside them bound a port of the dev cell's first: "Address already in use".)
pub fn free_base_port() -> u16 {
    free_ports(300) - 1
}

/// The first of `n` consecutive free loopback ports, from the turn all ports of this test binary are taken in.
fn free_ports(n: u32) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(997) % SPAN;
    for _ in 0..SPAN {
        let first = LOW + (start + NEXT.fetch_add(n, Ordering::Relaxed)) % SPAN;
        if first + n > LOW + SPAN {
            continue;
        }
        if (first..first + n).all(|port| TcpListener::bind(("127.0.0.1", port as u16)).is_ok()) {
            return first as u16;
        }
    }
    panic!("no {n} free loopback ports from {LOW} to {}", LOW + SPAN);
}

/// One node process and how to start it again.
pub struct NodeProcess {
    pub id: u64,
    pub client_addr: String,
    pub raft_addr: String,
    pub args: Vec<String>,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// The `cellog` binary it runs: this build's, or an earlier one's.
    pub binary: String,
}

impl NodeProcess {
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("a log file");
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env("CELLOG_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the cellog binary starts");
        self.child = Some(child);
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
        }
    }

    /// SIGTERM, then waits for the exit and returns whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().expect("kill runs");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().expect("waitable") {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn client(&self) -> Client {
        Client::new([self.client_addr.clone()], quick()).expect("a client")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Client options for tests: retry long enough to ride out an election.
pub fn quick() -> ClientOptions {
    ClientOptions { retry_for: Duration::from_secs(30), attempt_timeout: Duration::from_secs(5), ..Default::default() }
}

/// A cell of `n` node processes with data under `dir`.
pub fn cell(dir: &Path, cell: &str, n: u64) -> Vec<NodeProcess> {
    let addrs: Vec<(u64, String, String)> =
        (1..=n).map(|id| (id, format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()))).collect();
    addrs
        .iter()
        .map(|(id, client_addr, raft_addr)| {
            let mut args = vec![
                "node".to_string(),
                format!("--id={id}"),
                format!("--cell={cell}"),
                format!("--data-dir={}", dir.join(format!("node-{id}")).display()),
                format!("--client-addr={client_addr}"),
                format!("--raft-addr={raft_addr}"),
                "--metrics-addr=off".to_string(),
                "--insecure".to_string(),
                "--heartbeat-ms=50".to_string(),
                "--election-timeout-ms=300".to_string(),
            ];
            for (peer, peer_client, peer_raft) in &addrs {
                if peer != id {
                    args.push(format!("--peer={peer}={peer_raft}/{peer_client}"));
                }
            }
            NodeProcess {
                id: *id,
                client_addr: client_addr.clone(),
                raft_addr: raft_addr.clone(),
                args,
                log: dir.join(format!("node-{id}.log")),
                child: None,
                binary: env!("CARGO_BIN_EXE_cellog").to_string(),
            }
        })
        .collect()
}

/// Waits until some node reports a leader that has applied an entry; returns its id.
pub async fn wait_for_leader(nodes: &[NodeProcess]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for node in nodes.iter().filter(|node| node.child.is_some()) {
            if let Ok(status) = node.client().cluster_status().await
                && let Some(leader) = status.leader_id
                && status.state == "Leader"
                && status.applied_index.is_some()
            {
                return leader;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for node in nodes {
        eprintln!("--- node {} log:\n{}", node.id, node.log_text());
    }
    panic!("no leader within 30 s");
}

/// Waits until every running node has applied the same index with the same state digest.
pub async fn wait_converged(nodes: &[NodeProcess]) -> (u64, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Vec::new();
    while Instant::now() < deadline {
        let mut seen = Vec::new();
        for node in nodes.iter().filter(|node| node.child.is_some()) {
            if let Ok(status) = node.client().cluster_status_with_digest().await {
                seen.push((status.applied_index.unwrap_or_default(), status.state_digest));
            }
        }
        if seen.len() == nodes.len() && seen.windows(2).all(|pair| pair[0] == pair[1]) {
            return seen.remove(0);
        }
        last = seen;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("replicas did not converge: {last:?}");
}

/// Runs `cellog dev` until its ready line, returning the process and the lines it printed.
pub fn dev(data: &std::path::Path, base_port: u16) -> (std::process::Child, Vec<String>) {
    dev_with(data, base_port, &[])
}

/// [`dev`] with more of `cellog dev`'s arguments (`--cells 2`).
pub fn dev_with(data: &std::path::Path, base_port: u16, args: &[&str]) -> (std::process::Child, Vec<String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cellog"))
        .args(["dev", "--data", &data.display().to_string(), "--base-port", &base_port.to_string()])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("cellog dev starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = std::io::BufReader::new(stdout).lines();
    let mut lines = Vec::new();
    for line in reader.by_ref() {
        let line = line.expect("a line");
        let ready = line.starts_with("ready:");
        lines.push(line);
        if ready {
            // Keep reading what it prints later, as a terminal would.
            std::thread::spawn(move || reader.for_each(drop));
            return (child, lines);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("cellog dev ended before it was ready: {lines:?}");
}

pub fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let killed = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    assert!(killed.expect("kill runs").success());
    child.wait().expect("it exits")
}
