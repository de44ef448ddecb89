//! `cellog node` processes, one per host, each in its host's namespace with its own data directory: started,
//! killed with SIGKILL, paused with SIGSTOP and resumed with SIGCONT, and started again on what their disk holds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cellog_client::{Client, ClientOptions};

use crate::hosts::{Host, run};

/// The client port every node listens on (inside its own namespace).
pub const CLIENT_PORT: u16 = 7401;
/// The Raft port.
pub const RAFT_PORT: u16 = 7501;

/// One node process.
pub struct Node {
    /// Its host.
    pub host: Host,
    args: Vec<String>,
    binary: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl Node {
    /// The node of `host` in a cell of `hosts`, running `binary` with data and log under `work`.
    pub fn new(host: &Host, hosts: &[Host], binary: &Path, work: &Path) -> Node {
        let mut args = vec![
            "node".to_string(),
            format!("--id={}", host.id),
            "--cell=faults".to_string(),
            format!("--data-dir={}", work.join(format!("node-{}", host.id)).display()),
            format!("--client-addr={}:{CLIENT_PORT}", host.addr),
            format!("--raft-addr={}:{RAFT_PORT}", host.addr),
            "--metrics-addr=off".to_string(),
            "--insecure".to_string(),
            "--heartbeat-ms=50".to_string(),
            "--election-timeout-ms=300".to_string(),
        ];
        for peer in hosts.iter().filter(|peer| peer.id != host.id) {
            args.push(format!("--peer={}={}:{RAFT_PORT}/{}:{CLIENT_PORT}", peer.id, peer.addr, peer.addr));
        }
        Node {
            host: host.clone(),
            args,
            binary: binary.to_path_buf(),
            log: work.join(format!("node-{}.log", host.id)),
            child: None,
            paused: false,
        }
    }

    /// The node's client address.
    pub fn client_addr(&self) -> String {
        format!("{}:{CLIENT_PORT}", self.host.addr)
    }

    /// A client of this node only, never redirected.
    pub fn local_client(&self) -> Client {
        let options = ClientOptions {
            retry_for: Duration::ZERO,
            attempt_timeout: Duration::from_secs(5),
            discover: false,
            ..ClientOptions::default()
        };
        Client::new([self.client_addr()], options).expect("a valid address")
    }

    /// Whether its process runs (paused or not).
    pub fn up(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Starts the process in its namespace (`ip netns exec` execs into it, so the child is the node itself).
    pub fn start(&mut self) -> Result<(), String> {
        if self.up() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|error| format!("{}: {error}", self.log.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.host.namespace])
            .arg(&self.binary)
            .args(&self.args)
            .env("CELLOG_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("starting node {}: {error}", self.host.id))?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    fn signal(&self, signal: &str) -> Result<(), String> {
        match &self.child {
            Some(child) => run("kill", &[signal, &child.id().to_string()]),
            None => Ok(()),
        }
    }

    /// `kill -9`: the process dies; what it had not fsynced may be lost.
    pub fn kill(&mut self) -> Result<(), String> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child.wait().map_err(|error| format!("reaping node {}: {error}", self.host.id))?;
        }
        self.paused = false;
        Ok(())
    }

    /// SIGSTOP: the process stops being scheduled.
    pub fn pause(&mut self) -> Result<(), String> {
        self.signal("-STOP")?;
        self.paused = self.child.is_some();
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self) -> Result<(), String> {
        if self.paused {
            self.signal("-CONT")?;
            self.paused = false;
        }
        Ok(())
    }

    /// The end of its log, for a report.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.resume();
        let _ = self.kill();
    }
}
