//! What the node tests share.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU16, Ordering};

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
