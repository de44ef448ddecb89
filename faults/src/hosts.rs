//! Test hosts: one network namespace per node, joined by veth pairs to a bridge in the test's own namespace, where
//! the clients run. A partition is iptables rules inside a host's namespace; healing flushes them.

use std::net::Ipv4Addr;
use std::process::Command;

/// The bridge every host hangs off.
const BRIDGE: &str = "cellogft0";
/// The bridge's address: the clients' side.
const BRIDGE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);

/// Runs a command; an error names it and what it printed.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program).args(args).output().map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// One host: a namespace with one address on the bridge.
#[derive(Clone, Debug)]
pub struct Host {
    /// The node id it runs.
    pub id: u64,
    /// Its namespace.
    pub namespace: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

impl Host {
    fn veth(&self) -> (String, String) {
        (format!("cellogft{}", self.id), format!("cellogft{}p", self.id))
    }

    /// Runs `program` inside this host's namespace.
    fn exec(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["netns", "exec", self.namespace.as_str(), program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Drops every packet between this host and `others` (both ways), leaving the clients' link alone.
    pub fn cut_from(&self, others: &[&Host]) -> Result<(), String> {
        for other in others {
            let addr = other.addr.to_string();
            self.exec("iptables", &["-A", "INPUT", "-s", &addr, "-j", "DROP"])?;
            self.exec("iptables", &["-A", "OUTPUT", "-d", &addr, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Removes every rule a partition put here.
    pub fn heal(&self) -> Result<(), String> {
        self.exec("iptables", &["-F"])
    }
}

/// The hosts of a test, torn down when dropped.
pub struct Hosts {
    /// One per node, by id.
    pub hosts: Vec<Host>,
}

impl Hosts {
    /// Makes `n` hosts (after removing any a killed earlier test left behind).
    pub fn create(n: u64) -> Result<Hosts, String> {
        let hosts: Vec<Host> = (1..=n)
            .map(|id| Host { id, namespace: format!("cellogft-n{id}"), addr: Ipv4Addr::new(10, 88, 0, 10 + id as u8) })
            .collect();
        let made = Hosts { hosts };
        made.tear_down();
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        run("ip", &["addr", "add", &format!("{BRIDGE_ADDR}/24"), "dev", BRIDGE])?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        for host in &made.hosts {
            let (outside, inside) = host.veth();
            run("ip", &["netns", "add", &host.namespace])?;
            run("ip", &["link", "add", &outside, "type", "veth", "peer", "name", &inside])?;
            run("ip", &["link", "set", &inside, "netns", &host.namespace])?;
            run("ip", &["link", "set", &outside, "master", BRIDGE])?;
            run("ip", &["link", "set", &outside, "up"])?;
            host.exec("ip", &["addr", "add", &format!("{}/24", host.addr), "dev", &inside])?;
            host.exec("ip", &["link", "set", &inside, "up"])?;
            host.exec("ip", &["link", "set", "lo", "up"])?;
        }
        Ok(made)
    }

    /// Heals every partition.
    pub fn heal_all(&self) -> Result<(), String> {
        self.hosts.iter().try_for_each(Host::heal)
    }

    fn tear_down(&self) {
        for host in &self.hosts {
            let _ = run("ip", &["netns", "del", &host.namespace]);
            let _ = run("ip", &["link", "del", &host.veth().0]);
        }
        let _ = run("ip", &["link", "del", BRIDGE]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.tear_down();
    }
}
