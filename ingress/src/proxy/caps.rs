//! Connection caps: how many client connections the process holds at once, in all and per
//! client. A connection over a cap is closed as soon as it is accepted, before it costs a task,
//! a buffer or a TLS handshake, and counted in `ingress_connections_refused_total`.
//!
//! A client is an IPv4 address, or an IPv6 /64: one host is routinely given a whole /64, so
//! counting single IPv6 addresses would let one client have as many as it likes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Why a connection was refused: the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `--max-connections`.
    Total,
    /// `--max-connections-per-client`.
    PerClient,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "max_connections",
            Refused::PerClient => "max_connections_per_client",
        }
    }
}

/// The client a connection is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    V4(u32),
    V6Prefix(u64),
}

impl From<IpAddr> for Client {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Client::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client::V4(u32::from(v4)),
                None => Client::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

pub struct ConnectionCaps {
    max_total: usize,
    /// 0: no per-client cap.
    max_per_client: u32,
    total: AtomicUsize,
    per_client: Mutex<HashMap<Client, u32, foldhash::fast::RandomState>>,
}

/// Holds a connection's place under the caps until dropped.
pub struct Permit {
    caps: Arc<ConnectionCaps>,
    client: Option<Client>,
}

impl Permit {
    /// Counts the connection against `ip`'s cap too (once; later calls do nothing).
    pub fn claim_client(&mut self, ip: IpAddr) -> Result<(), Refused> {
        if self.caps.max_per_client == 0 || self.client.is_some() {
            return Ok(());
        }
        let client = Client::from(ip);
        let mut counts = self
            .caps
            .per_client
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(client).or_insert(0);
        if *count >= self.caps.max_per_client {
            return Err(Refused::PerClient);
        }
        *count += 1;
        self.client = Some(client);
        Ok(())
    }
}

impl ConnectionCaps {
    /// `max_total` 0 means no cap in all; `max_per_client` 0 means none per client.
    pub fn new(max_total: usize, max_per_client: u32) -> Arc<Self> {
        Arc::new(Self {
            max_total: if max_total == 0 {
                usize::MAX
            } else {
                max_total
            },
            max_per_client,
            total: AtomicUsize::new(0),
            per_client: Mutex::new(HashMap::default()),
        })
    }

    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Permit, Refused> {
        let mut permit = self.admit_total()?;
        permit.claim_client(ip)?;
        Ok(permit)
    }

    /// Counts a connection against the total cap only; the client is counted once it is
    /// known ([`Permit::claim_client`]), as with the PROXY protocol, where the TCP peer is the
    /// load balancer.
    pub fn admit_total(self: &Arc<Self>) -> Result<Permit, Refused> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Total);
        }
        Ok(Permit {
            caps: self.clone(),
            client: None,
        })
    }

    /// Connections held right now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.caps.total.fetch_sub(1, Ordering::AcqRel);
        if let Some(client) = self.client {
            let mut counts = self
                .caps
                .per_client
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(count) = counts.get_mut(&client) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&client);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_in_all_and_per_client() {
        let caps = ConnectionCaps::new(4, 2);
        let a1 = caps.admit(ip("192.0.2.1")).unwrap();
        let _a2 = caps.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(caps.admit(ip("192.0.2.1")).err(), Some(Refused::PerClient));
        // The same client over IPv4-mapped IPv6.
        assert_eq!(
            caps.admit(ip("::ffff:192.0.2.1")).err(),
            Some(Refused::PerClient)
        );
        let _b1 = caps.admit(ip("2001:db8::1")).unwrap();
        // Another address in the same /64 is the same client.
        let _b2 = caps.admit(ip("2001:db8::ffff")).unwrap();
        assert_eq!(caps.open(), 4);
        assert_eq!(caps.admit(ip("198.51.100.1")).err(), Some(Refused::Total));
        drop(a1);
        assert_eq!(caps.open(), 3);
        let _c = caps.admit(ip("198.51.100.1")).unwrap();
        assert_eq!(
            caps.admit(ip("2001:db8:0:1::1")).err(),
            Some(Refused::Total)
        );
    }

    #[test]
    fn zero_means_no_cap() {
        let caps = ConnectionCaps::new(0, 0);
        let permits: Vec<_> = (0..1000)
            .map(|_| caps.admit(ip("192.0.2.1")).unwrap())
            .collect();
        assert_eq!(caps.open(), 1000);
        drop(permits);
        assert_eq!(caps.open(), 0);
        assert!(caps.per_client.lock().unwrap().is_empty());
    }
}
