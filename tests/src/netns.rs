//! Network namespaces joined by veth links, removed on drop, so a test's traffic crosses a real
//! link (MTU 1500, so a 2 KB ClientHello arrives in two segments) and touches nothing outside
//! the test:
//!
//! ```text
//!   NetPair:   client 10.231.0.2 ── veth0 ── veth0 10.231.0.1 server
//!   NetChain:  client 10.241.0.2 ── c0 ── p0 10.241.0.1 proxy 10.241.1.1 p1 ── b0 ── 10.241.1.2 backend
//! ```
//!
//! Namespaces are entered with `setns` from code, one thread at a time, or with
//! `nsenter --net=` for child processes — never `ip netns exec`, which remounts /sys and hides
//! the cgroup2 mount the gate attaches to.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);

/// One named network namespace (`/run/netns/<name>`), deleted on drop.
pub struct NetNs {
    name: String,
}

impl NetNs {
    pub fn create(name: String) -> io::Result<NetNs> {
        ip(&["netns", "add", &name])?;
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Moves the calling thread into this namespace. Sockets it creates afterwards live here;
    /// child processes it spawns start here.
    pub fn enter(&self) -> io::Result<()> {
        let file = std::fs::File::open(self.path())?;
        // SAFETY: a valid namespace fd; setns only affects the calling thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Runs `f` on a fresh thread inside this namespace, for making sockets there without
    /// moving the caller.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let path = self.path();
        std::thread::spawn(move || -> io::Result<T> {
            let file = std::fs::File::open(path)?;
            // SAFETY: as in `enter`.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("namespace thread panicked"))?
    }

    /// Runs `program args…` inside this namespace and waits for it; an error if it fails.
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<()> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.path().display()))
            .arg(program)
            .args(args)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The hardware address of `ifname` here.
    pub fn mac(&self, ifname: &str) -> io::Result<[u8; 6]> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-j", "link", "show", ifname])
            .output()?;
        let links: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(io::Error::other)?;
        let text = links[0]["address"]
            .as_str()
            .ok_or_else(|| io::Error::other(format!("no address for {ifname}")))?;
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut mac {
            let part = parts
                .next()
                .ok_or_else(|| io::Error::other(format!("bad MAC {text}")))?;
            *byte = u8::from_str_radix(part, 16).map_err(io::Error::other)?;
        }
        Ok(mac)
    }

    /// `n` TCP sockets made here (a socket stays in the namespace it was made in).
    pub fn tcp_sockets(&self, n: usize) -> Vec<tokio::net::TcpSocket> {
        self.run(move || {
            (0..n)
                .map(|_| tokio::net::TcpSocket::new_v4().expect("a TCP socket"))
                .collect()
        })
        .expect("a thread in the namespace")
    }

    /// A TCP connection from this namespace to `addr`, with Nagle off, within `timeout`.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
        timeout: std::time::Duration,
    ) -> tokio::net::TcpStream {
        let socket = self.tcp_sockets(1).pop().expect("a socket");
        let stream = tokio::time::timeout(timeout, socket.connect(addr))
            .await
            .unwrap_or_else(|_| panic!("connect to {addr} in time"))
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        stream
    }

    /// Runs `f` on a long-lived thread of its own inside this namespace (a server, say).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = self.path();
        std::thread::spawn(move || {
            let file =
                std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // SAFETY: as in `enter`.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
            f()
        })
    }

    /// `nsenter --net=<path> <program>`, for clients such as openssl and curl.
    pub fn command(&self, program: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg(program);
        cmd
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("removing network namespace {}: {e}", self.name);
        }
    }
}

/// Server and client namespaces with `SERVER_IP` and `CLIENT_IP` on either end of a veth pair.
pub struct NetPair {
    pub server: NetNs,
    pub client: NetNs,
}

impl NetPair {
    pub fn create(tag: &str) -> io::Result<NetPair> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("{tag}-{}-{n}", std::process::id());
        let server = NetNs::create(format!("{base}-s"))?;
        let client = NetNs::create(format!("{base}-c"))?;
        // Both ends are created inside their namespaces: nothing appears in the host's.
        ip(&[
            "link",
            "add",
            "veth0",
            "netns",
            server.name(),
            "type",
            "veth",
            "peer",
            "name",
            "veth0",
            "netns",
            client.name(),
        ])?;
        for (ns, addr) in [(&server, SERVER_IP), (&client, CLIENT_IP)] {
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "veth0"])?;
            // One MSS per packet, as on a real wire: with segmentation offload a veth would
            // carry a 2 KB write as one packet and the receiver would never see it split.
            ns.ip(&["link", "set", "veth0", "gso_max_segs", "1"])?;
            // No offloads at all: checksums are computed by the sender and verified by the
            // receiver (a veth with rx checksumming on would mark every packet verified, so a
            // segment with a bad checksum would be accepted), and nothing is merged or split
            // behind the test's back.
            ns.exec(
                "ethtool",
                &[
                    "-K", "veth0", "rx", "off", "tx", "off", "tso", "off", "gso", "off", "gro",
                    "off",
                ],
            )?;
            ns.ip(&["link", "set", "veth0", "up"])?;
        }
        Ok(NetPair { server, client })
    }

    /// A packet socket on the client side of the link for [`crate::rawtcp`], speaking as
    /// `RAW_IP`: the server is told where that address lives, the client's kernel never hears
    /// of it.
    pub fn raw_link(&self) -> io::Result<crate::rawtcp::RawLink> {
        let mac = crate::rawtcp::RAW_MAC
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        self.server.ip(&[
            "neigh",
            "replace",
            &crate::rawtcp::RAW_IP.to_string(),
            "lladdr",
            &mac,
            "dev",
            "veth0",
            "nud",
            "permanent",
        ])?;
        let server_mac = self.server.mac("veth0")?;
        crate::rawtcp::RawLink::open(&self.client, "veth0", crate::rawtcp::RAW_MAC, server_mac)
    }
}

/// Client, proxy and backend namespaces in a line, for a proxy between a client and a backend
/// that are each in a namespace of their own. The client link carries one MSS per packet, as a
/// wire does, so a ClientHello arrives in pieces; the backend link keeps its offloads, as a
/// node's pod network does.
pub struct NetChain {
    pub client: NetNs,
    pub proxy: NetNs,
    pub backend: NetNs,
}

impl NetChain {
    pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 241, 0, 2);
    /// The proxy's address on the client side.
    pub const PROXY_IP: Ipv4Addr = Ipv4Addr::new(10, 241, 0, 1);
    /// The proxy's address on the backend side.
    pub const PROXY_BACKEND_SIDE: Ipv4Addr = Ipv4Addr::new(10, 241, 1, 1);
    pub const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 241, 1, 2);

    pub fn create(tag: &str) -> io::Result<NetChain> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("pt-{tag}-{}-{n}", std::process::id());
        let chain = NetChain {
            client: NetNs::create(format!("{base}-c"))?,
            proxy: NetNs::create(format!("{base}-p"))?,
            backend: NetNs::create(format!("{base}-b"))?,
        };
        let links = [
            (
                &chain.client,
                "c0",
                Self::CLIENT_IP,
                &chain.proxy,
                "p0",
                Self::PROXY_IP,
            ),
            (
                &chain.proxy,
                "p1",
                Self::PROXY_BACKEND_SIDE,
                &chain.backend,
                "b0",
                Self::BACKEND_IP,
            ),
        ];
        for (a, a_dev, a_ip, b, b_dev, b_ip) in links {
            ip(&[
                "link",
                "add",
                a_dev,
                "netns",
                a.name(),
                "type",
                "veth",
                "peer",
                "name",
                b_dev,
                "netns",
                b.name(),
            ])?;
            for (ns, dev, addr) in [(a, a_dev, a_ip), (b, b_dev, b_ip)] {
                ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev])?;
                ns.ip(&["link", "set", dev, "up"])?;
            }
        }
        for (ns, dev) in [(&chain.client, "c0"), (&chain.proxy, "p0")] {
            ns.ip(&["link", "set", dev, "gso_max_segs", "1"])?;
        }
        Ok(chain)
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
