//! Free loopback ports for test processes.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// A port that was free a moment ago and has not been handed out before in this process.
/// Another process could still take it; the tests accept that small race.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind :0");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// A listener on a loopback port from `free_port`, so test servers never take a port already
/// handed to an `ingress` that has not bound it yet.
pub fn listen_loopback() -> TcpListener {
    loop {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", free_port())) {
            return listener;
        }
    }
}
