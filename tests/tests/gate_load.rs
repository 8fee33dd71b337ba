//! The gate under load, through the real proxy in both modes: split hellos on one busy CPU and
//! verdicts interrupted on their CPU (nested runs must never share a workspace); a flood of
//! stalled hellos beside known names (no per-connection record evicted or refused); admitted
//! connections holding no kernel records; a thousand concurrent mixed connections, each
//! classified as its kind; and route changes under load, which never reset a name that stays
//! valid.
//!
//! The site (namespaces, backend, certificate, manifests, proxies) is `ingress_tests::gate_site`.
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingress_tests::bpftool;
use ingress_tests::corpus::corpus;
use ingress_tests::gate_site::{KNOWN, MAIN, STEP, Site, WILDCARD, scrape_until, server};
use ingress_tests::netns::{NetPair, SERVER_IP};
use ingress_tests::scrape::{REASONS, Scrape};
use ingress_tests::tls_client::{Clients, Ending, Outcome, Pieces, https_get, send_raw};
use ingress_tests::{Mode, both_modes};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The flood below holds nearly every descriptor this process may open; the other tests here
/// hold it shared, so none of them runs beside the flood and finds no descriptor left.
static DESCRIPTORS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

both_modes!(split_hellos_on_one_busy_cpu_are_never_refused);

/// Many two-segment ClientHellos for a served name with the proxy on one CPU, clients and a
/// softirq flood on both: a decision running in process context (the strparser's work) is
/// interrupted by decisions running in softirq on the same CPU. None may be refused (a
/// workspace shared between them made the inner one see the outer one's extensions as
/// duplicates), and once it is over no workspace is left claimed or with bits set.
async fn split_hellos_on_one_busy_cpu_are_never_refused(mode: Mode) {
    let _shared = DESCRIPTORS.read().await;
    const N: usize = 2000;
    const AT_ONCE: usize = 16;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(site) = Site::new(&format!("busy-{}", mode.flag()), &["chromium.example.test"]) else {
        return;
    };
    let proxy = site
        .proxy()
        .mode(mode)
        .wrapper(["taskset", "-c", "0"])
        .start();
    let before = proxy.scrape();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = softirq_load(&site.pair, 0, stop.clone());
    // The strparser's work runs on whichever CPU is free: load the other one too.
    let other = softirq_load(&site.pair, 1, stop.clone());

    let sockets = Arc::new(std::sync::Mutex::new(site.pair.client.tcp_sockets(N)));
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let mut clients = Vec::new();
    for i in 0..AT_ONCE {
        let (sockets, outcomes, hello) = (sockets.clone(), outcomes.clone(), hello.clone());
        clients.push(std::thread::spawn(move || {
            pin_thread(i % 2);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                loop {
                    let Some(socket) = sockets.lock().expect("sockets").pop() else {
                        return;
                    };
                    let ending = match socket.connect(server(MAIN.https)).await {
                        Ok(stream) => {
                            let _ = stream.set_nodelay(true);
                            match send_raw(stream, &[&hello], Duration::ZERO).await {
                                Ending::Answered(bytes) if bytes.starts_with(&[0x16, 3, 3]) => {
                                    "served".to_string()
                                }
                                other => format!("{other:?}"),
                            }
                        }
                        Err(e) => format!("connect: {e}"),
                    };
                    *outcomes
                        .lock()
                        .expect("outcomes")
                        .entry(ending)
                        .or_default() += 1;
                }
            });
        }));
    }
    for client in clients {
        tokio::task::spawn_blocking(move || client.join().expect("client thread"))
            .await
            .expect("join");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let datagrams = tokio::task::spawn_blocking(move || {
        flood.join().expect("flood") + other.join().expect("flood")
    })
    .await
    .expect("join");
    let outcomes = outcomes.lock().expect("outcomes").clone();
    eprintln!("{mode:?}: {outcomes:?}, {datagrams} datagrams of softirq load");
    assert_eq!(
        outcomes.get("served").copied().unwrap_or(0),
        N,
        "a served name was refused: {outcomes:?}"
    );
    let after = scrape_until(&proxy, "every pass counted", |s| {
        s.gate("pass") >= before.gate("pass") + N as f64
    })
    .await;
    assert_eq!(after.gate("malformed"), before.gate("malformed"));
    if mode == Mode::Ebpf {
        assert_eq!(
            after.kernel("malformed"),
            before.kernel("malformed"),
            "{}",
            after.0
        );
        assert_eq!(after.kernel("pass") - before.kernel("pass"), N as f64);
        // Pins of a build that keeps its workspaces pinned (older ones did not).
        if site.pins.join("workspace_busy").exists() {
            let seen = ingress::gate::pinned_workspaces(site.pins.path()).expect("workspaces");
            assert_eq!(
                (seen.claimed, seen.dirty_words),
                (0, 0),
                "a workspace was left claimed or dirty: {seen:?}"
            );
        }
    }
}

/// Stream verdicts in process context (the strparser's work, which parses a hello that came
/// before accept) interrupted on their CPU by stream verdicts in softirq (hellos whose second
/// segment lands after accept): every packet the server receives is processed on CPU 0 (RPS)
/// while the proxy and the clients keep CPU 1 busy, so the work runs on CPU 0 too. Each run
/// has a workspace of its own: not one served name is refused (sharing one, the inner run
/// found the outer one's extensions in its duplicate bitmap and called the hello malformed),
/// and none is left claimed or dirty.
#[tokio::test]
async fn a_verdict_interrupted_on_its_cpu_never_disturbs_the_interrupting_one() {
    let _shared = DESCRIPTORS.read().await;
    const N: usize = 3000;
    let hello = Arc::new(corpus("chromium-2.bin"));
    let Some(site) = Site::new("nested", &["chromium.example.test"]) else {
        return;
    };
    let proxy = site.proxy().ebpf().wrapper(["taskset", "-c", "1"]).start();
    // Received packets on the server's end of the link are processed on CPU 0, whichever CPU
    // sent them (`ip netns exec` mounts the namespace's own /sys for this one command).
    let rps = Command::new("ip")
        .args(["netns", "exec", site.pair.server.name(), "sh", "-c"])
        .arg("echo 1 > /sys/class/net/veth0/queues/rx-0/rps_cpus")
        .status()
        .expect("ip netns exec");
    assert!(rps.success(), "setting rps_cpus");
    let before = proxy.scrape();

    let sockets = Arc::new(std::sync::Mutex::new(site.pair.client.tcp_sockets(N)));
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let mut clients = Vec::new();
    for i in 0..8 {
        let (sockets, outcomes, hello) = (sockets.clone(), outcomes.clone(), hello.clone());
        clients.push(std::thread::spawn(move || {
            pin_thread(1);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                loop {
                    let Some(socket) = sockets.lock().expect("sockets").pop() else {
                        return;
                    };
                    let ending = match socket.connect(server(MAIN.https)).await {
                        Ok(stream) => {
                            let _ = stream.set_nodelay(true);
                            // Half the clients send the hello at once (parsed by the work,
                            // after accept's peek), half pause before its second segment
                            // (parsed in softirq as it lands).
                            let (first, rest) = hello.split_at(1000);
                            let pause = if i % 2 == 0 {
                                Duration::ZERO
                            } else {
                                Duration::from_millis(2)
                            };
                            match send_raw(stream, &[first, rest], pause).await {
                                Ending::Answered(bytes) if bytes.starts_with(&[0x16, 3, 3]) => {
                                    "served".to_string()
                                }
                                other => format!("{other:?}"),
                            }
                        }
                        Err(e) => format!("connect: {e}"),
                    };
                    *outcomes
                        .lock()
                        .expect("outcomes")
                        .entry(ending)
                        .or_default() += 1;
                }
            });
        }));
    }
    for client in clients {
        tokio::task::spawn_blocking(move || client.join().expect("client thread"))
            .await
            .expect("join");
    }
    let outcomes = outcomes.lock().expect("outcomes").clone();
    // Every connection is decided once, by the kernel or (a verdict that did not come within
    // --gate-timeout, which a machine under heavy load can cause) by the userspace gate:
    // ingress_sni_gate_total counts both.
    let after = scrape_until(&proxy, "every decision counted", |s| {
        REASONS
            .iter()
            .map(|r| s.gate(r) - before.gate(r))
            .sum::<f64>()
            >= N as f64
    })
    .await;
    eprintln!(
        "{outcomes:?}; kernel pass {} malformed {} parser_waited {} (of {N} decisions)",
        after.kernel("pass") - before.kernel("pass"),
        after.kernel("malformed") - before.kernel("malformed"),
        after.kernel("parser_waited") - before.kernel("parser_waited"),
    );
    assert_eq!(
        outcomes.get("served").copied().unwrap_or(0),
        N,
        "a served name was refused: {outcomes:?}"
    );
    assert_eq!(
        after.kernel("malformed"),
        before.kernel("malformed"),
        "{}",
        after.0
    );
    assert_eq!(after.gate("malformed"), before.gate("malformed"));
    // The kernel decided (nearly) all of them: this is a test of its nested runs, not of the
    // userspace fallback.
    let by_kernel: f64 = REASONS
        .iter()
        .map(|r| after.kernel(r) - before.kernel(r))
        .sum();
    assert!(
        by_kernel >= (N - N / 100) as f64,
        "{by_kernel} of {N}: {}",
        after.0
    );
    if site.pins.join("workspace_busy").exists() {
        let seen = ingress::gate::pinned_workspaces(site.pins.path()).expect("workspaces");
        assert_eq!((seen.claimed, seen.dirty_words), (0, 0), "{seen:?}");
    }
}

/// Pins the calling thread to `cpu`.
fn pin_thread(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is empty; CPU_SET only sets a bit in it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size passed, for the calling thread (0).
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", io::Error::last_os_error());
}

/// UDP datagrams to the server's discard port as fast as one thread on `cpu` sends them, until
/// `stop`: the kernel receives each one in softirq on that CPU, which interrupts whatever runs
/// there in process context (a stream verdict run by the strparser's work, say).
fn softirq_load(
    pair: &NetPair,
    cpu: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let socket = pair
        .client
        .run(|| std::net::UdpSocket::bind("0.0.0.0:0").expect("udp socket"))
        .expect("client namespace thread");
    std::thread::spawn(move || {
        pin_thread(cpu);
        let target = SocketAddr::from((SERVER_IP, 9));
        let payload = [0u8; 64];
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
            if socket.send_to(&payload, target).is_ok() {
                sent += 1;
            }
        }
        sent
    })
}

both_modes!(a_flood_of_stalled_hellos_never_costs_a_known_name);

/// 3,300 connections a second that send a record header and stall, each held for the gate
/// timeout, as many at once as the process limits allow (the test and the proxy each hold one
/// descriptor per connection). Known names, arriving in pieces (so through the socket path)
/// all the while, are all served: no per-connection record of theirs is evicted or refused for
/// want of room.
async fn a_flood_of_stalled_hellos_never_costs_a_known_name(mode: Mode) {
    const RATE: u32 = 3300;
    // Each mode's flood takes nearly all of this process's descriptors: it runs alone.
    let _alone = DESCRIPTORS.write().await;
    let Some(site) = Site::new(&format!("stalled-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // Room for the known traffic and everything else the test and the proxy hold.
    let count = usize::try_from(raise_nofile().saturating_sub(2000))
        .unwrap_or(usize::MAX)
        .min(40_000);
    eprintln!(
        "{count} stalled connections (more than 32,768: {})",
        count > 32_768
    );
    site.pair
        .client
        .exec(
            "sysctl",
            &["-qw", "net.ipv4.ip_local_port_range=1024 65535"],
        )
        .expect("port range");
    // The flood comes from one address, in more connections than the connection caps allow
    // one client (or all of them); this measures the gate's own per-connection state, so the
    // caps (edge_limits.rs tests them) are off.
    let proxy = site.start(
        mode,
        &[
            "--max-connections",
            "0",
            "--max-connections-per-client",
            "0",
        ],
    );
    let before = proxy.scrape();
    // Records can no longer be evicted whatever the flood's size: the per-connection maps are
    // plain hashes (an LRU evicted the freshest records first), each sized for every
    // connection SOCKS can hold. A machine whose descriptor limit cannot be raised past the
    // old LRU's 32,768 (no CAP_SYS_RESOURCE) floods with what it has.
    for map in ["verdicts"].iter().filter(|_| mode == Mode::Ebpf) {
        let pin = site.pins.join(map);
        let info = bpftool::json(&["map", "show", "pinned", pin.to_str().expect("utf-8 path")]);
        assert_eq!(info["type"], "hash", "{map}: {info}");
        assert!(
            info["max_entries"].as_u64() >= Some(65_536),
            "{map} is smaller than SOCKS: {info}"
        );
    }

    let hello = corpus("curl-tls13.bin");
    let flood = partial_hello_flood(
        &site.pair,
        hello[..100].to_vec(),
        count,
        RATE,
        Duration::from_secs(20),
    );
    let flooding = Instant::now();
    let flood_time = Duration::from_secs_f64(count as f64 / f64::from(RATE));
    let mut known: BTreeMap<String, usize> = BTreeMap::new();
    let mut during = Vec::new();
    while flooding.elapsed() < flood_time + Duration::from_secs(3) {
        let round = (0..4).map(|_| async {
            let pieces = Pieces::new(
                site.connect(MAIN.https).await,
                &[5, 150],
                Duration::from_millis(20),
            );
            https_get(pieces, &site.clients, Some(KNOWN), KNOWN).await
        });
        for outcome in futures_util::future::join_all(round).await {
            *known.entry(format!("{outcome:?}")).or_default() += 1;
        }
        during.push(proxy.scrape());
    }
    let tally = tokio::task::spawn_blocking(move || flood.join().expect("flood thread"))
        .await
        .expect("join");
    let after = proxy.scrape();
    eprintln!("{mode:?}: known {known:?}\n  flood {tally:?}");
    if mode == Mode::Ebpf {
        for counter in [
            "sock_added",
            "sock_add_failed",
            "record_failed",
            "parser_waited",
            "pass",
        ] {
            eprintln!(
                "  {counter}: {}",
                after.kernel(counter) - before.kernel(counter)
            );
        }
    }
    let served = known
        .get(&format!("{:?}", Outcome::Served(200)))
        .copied()
        .unwrap_or(0);
    let total: usize = known.values().sum();
    assert!(
        total >= 40,
        "too little known traffic to mean anything: {known:?}"
    );
    assert_eq!(
        served, total,
        "a known name failed during the flood: {known:?}"
    );
    if mode == Mode::Ebpf {
        // Room for every stalled connection: none was left to userspace for want of space.
        assert_eq!(
            after.kernel("sock_add_failed"),
            before.kernel("sock_add_failed")
        );
        assert_eq!(
            after.kernel("record_failed"),
            before.kernel("record_failed")
        );
    }
}

/// Admission is over once the first record is handed to TLS: a connection the gate admitted keeps
/// no per-connection record in the kernel while it stays open, whichever path admitted it
/// (single-segment hellos before accept, split ones on the socket). Records that lived until
/// the connection closed were what the LRU evicted under a flood.
#[tokio::test]
async fn admitted_connections_hold_no_kernel_records_while_open() {
    let _shared = DESCRIPTORS.read().await;
    let Some(site) = Site::new("admitted", &[KNOWN]) else {
        return;
    };
    let proxy = site.start(Mode::Ebpf, &[]);
    let one_segment = ingress_tests::pki::one_segment_hello_config(&[b"http/1.1"]);
    let before = proxy.scrape();
    let mut open = Vec::new();
    for i in 0..20 {
        let (cuts, config): (&[usize], _) = if i % 2 == 0 {
            (&[], one_segment.clone())
        } else {
            (&[5, 150], site.clients.verified.clone())
        };
        let pieces = Pieces::new(
            site.connect(MAIN.https).await,
            cuts,
            Duration::from_millis(20),
        );
        let name = ServerName::try_from(KNOWN.to_string()).expect("a DNS name");
        let mut tls =
            tokio::time::timeout(STEP * 2, TlsConnector::from(config).connect(name, pieces))
                .await
                .expect("handshake in time")
                .unwrap_or_else(|e| panic!("#{i}: handshake: {e}; logs:\n{}", proxy.logs()));
        let request = format!("GET / HTTP/1.1\r\nHost: {KNOWN}\r\n\r\n");
        tls.write_all(request.as_bytes()).await.expect("request");
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(STEP * 2, tls.read(&mut buf))
            .await
            .expect("response in time")
            .expect("response");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "#{i}: {}",
            String::from_utf8_lossy(&buf[..n])
        );
        open.push(tls);
    }
    let after = scrape_until(&proxy, "20 passes", |s| {
        s.kernel("pass") >= before.kernel("pass") + 20.0
    })
    .await;
    // Both paths were taken: some before accept, some on the socket.
    assert!(
        after.kernel("passed_before_accept") > before.kernel("passed_before_accept"),
        "no hello was decided before accept"
    );
    assert!(
        after.kernel("sock_added") > before.kernel("sock_added"),
        "no hello was decided on the socket"
    );
    for map in ["verdicts", "passed_early"] {
        assert_eq!(
            bpftool::map_entries(&site.pins.join(map)),
            0,
            "{map} holds records of {} connections that are open and past admission",
            open.len()
        );
    }
    drop(open);
}

/// This process's open-file limit, the soft one raised to the hard one (children inherit it).
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit writes into the struct it is given.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit: {}", io::Error::last_os_error());
    // With CAP_SYS_RESOURCE the hard limit can be raised too (up to fs.nr_open).
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max.max(100_000),
        rlim_max: limit.rlim_max.max(100_000),
    };
    // SAFETY: a valid rlimit; raising the hard limit needs CAP_SYS_RESOURCE.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return raised.rlim_cur;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: a valid rlimit within the hard limit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", io::Error::last_os_error());
    limit.rlim_cur
}

/// `count` connections at `rate` per second, each sending the first `prefix.len()` bytes of a
/// ClientHello (the header promises more) and then holding on until the server ends it or
/// `hold` passes. Runs on its own thread; returns how the connections ended.
fn partial_hello_flood(
    pair: &NetPair,
    prefix: Vec<u8>,
    count: usize,
    rate: u32,
    hold: Duration,
) -> std::thread::JoinHandle<BTreeMap<String, usize>> {
    let sockets = pair.client.tcp_sockets(count);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let prefix = Arc::new(prefix);
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for (i, socket) in sockets.into_iter().enumerate() {
                let due = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
                tokio::time::sleep_until(due.into()).await;
                let prefix = prefix.clone();
                tasks.spawn(async move {
                    let connect = tokio::time::timeout(hold, socket.connect(server(MAIN.https)));
                    let Ok(Ok(mut stream)) = connect.await else {
                        return "connect failed".to_string();
                    };
                    if stream.write_all(&prefix).await.is_err() {
                        return "write failed".to_string();
                    }
                    let mut buf = [0u8; 64];
                    match tokio::time::timeout(hold, stream.read(&mut buf)).await {
                        Err(_) => "held to the end".to_string(),
                        Ok(Ok(0)) => "closed".to_string(),
                        Ok(Ok(_)) => "answered".to_string(),
                        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                            "reset".to_string()
                        }
                        Ok(Err(e)) => format!("{:?}", e.kind()),
                    }
                });
            }
            let mut tally = BTreeMap::new();
            while let Some(done) = tasks.join_next().await {
                *tally.entry(done.expect("flood task")).or_default() += 1;
            }
            tally
        })
    })
}

both_modes!(a_thousand_concurrent_mixed_connections_are_all_classified);

async fn a_thousand_concurrent_mixed_connections_are_all_classified(mode: Mode) {
    let _shared = DESCRIPTORS.read().await;
    const N: usize = 1000;
    let Some(site) = Site::new(&format!("mixed-{}", mode.flag()), &[KNOWN, WILDCARD]) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let before = proxy.scrape();
    let sockets = site.pair.client.tcp_sockets(N);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        let kind = Kind::ALL[i % Kind::ALL.len()];
        let clients = site.clients.clone();
        tasks.spawn(async move {
            let outcome = match socket.connect(server(MAIN.https)).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    kind.run(i, stream, clients).await
                }
                Err(e) => Outcome::Failed(format!("connect: {e}")),
            };
            (kind, outcome)
        });
    }
    let mut tally: BTreeMap<(Kind, String), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    let all = async {
        while let Some(joined) = tasks.join_next().await {
            let (kind, outcome) = joined.expect("client task");
            *tally.entry((kind, format!("{outcome:?}"))).or_default() += 1;
            if outcome != kind.expected() {
                wrong.push(format!("{kind:?}: {outcome:?}"));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(180), all)
        .await
        .expect("1000 connections finished within 3 minutes");
    eprintln!("{N} connections in {:?} ({mode:?}):", started.elapsed());
    for ((kind, outcome), count) in &tally {
        eprintln!("  {kind:?} -> {outcome}: {count}");
    }
    assert!(
        wrong.is_empty(),
        "{} of {N} misclassified, e.g.:\n{}\nlogs:\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        proxy.logs()
    );

    // The proxy's counters (and the kernel's) agree with what the clients saw.
    let mut want: BTreeMap<&str, f64> = BTreeMap::new();
    for i in 0..N {
        *want
            .entry(Kind::ALL[i % Kind::ALL.len()].reason())
            .or_default() += 1.0;
    }
    let after = scrape_until(&proxy, "every decision counted", |s| {
        REASONS
            .iter()
            .map(|r| s.gate(r) - before.gate(r))
            .sum::<f64>()
            >= N as f64
    })
    .await;
    for reason in REASONS {
        let want = want.get(reason).copied().unwrap_or(0.0);
        assert_eq!(
            after.gate(reason) - before.gate(reason),
            want,
            "proxy {reason}"
        );
        if mode == Mode::Ebpf {
            assert_eq!(
                after.kernel(reason) - before.kernel(reason),
                want,
                "kernel {reason}"
            );
        }
    }
    let served = want["pass"] + want["no_sni"];
    assert_eq!(
        after.value("ingress_tls_handshakes_total", &[("result", "ok")])
            - before.value("ingress_tls_handshakes_total", &[("result", "ok")]),
        served
    );
    assert_eq!(
        after.handshakes() - before.handshakes(),
        served,
        "no other handshakes"
    );
    if mode == Mode::Ebpf {
        for counter in ["sock_add_failed", "event_lost", "record_failed"] {
            assert_eq!(after.kernel(counter), 0.0, "{counter}");
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Known,
    Unknown,
    Wildcard,
    Deeper,
    NoSni,
    Garbage,
    PlainHttp,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Known,
        Kind::Unknown,
        Kind::Wildcard,
        Kind::Deeper,
        Kind::NoSni,
        Kind::Garbage,
        Kind::PlainHttp,
    ];

    fn expected(self) -> Outcome {
        match self {
            Kind::Known | Kind::Wildcard => Outcome::Served(200),
            // Admitted and handshaken, but the host it asks for has a certificate of its own.
            Kind::NoSni => Outcome::Served(421),
            _ => Outcome::Reset,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Kind::Known | Kind::Wildcard => "pass",
            Kind::Unknown | Kind::Deeper => "unknown",
            Kind::NoSni => "no_sni",
            Kind::Garbage | Kind::PlainHttp => "not_tls",
        }
    }

    async fn run(self, i: usize, stream: TcpStream, clients: Clients) -> Outcome {
        let sni = match self {
            Kind::Known => Some(KNOWN.to_string()),
            Kind::Unknown => Some(format!("nobody-{i}.test")),
            Kind::Wildcard => Some(format!("w{i}.wild.test")),
            Kind::Deeper => Some(format!("x.w{i}.wild.test")),
            Kind::NoSni => None,
            Kind::Garbage | Kind::PlainHttp => {
                let file = if self == Kind::Garbage {
                    "garbage.bin"
                } else {
                    "http-get.bin"
                };
                return match send_raw(stream, &[&corpus(file)], Duration::ZERO).await {
                    Ending::Reset(_) => Outcome::Reset,
                    other => Outcome::Failed(format!("{other:?}")),
                };
            }
        };
        https_get(stream, &clients, sni.as_deref(), KNOWN).await
    }
}

both_modes!(a_route_change_under_load_never_resets_a_still_valid_name);

async fn a_route_change_under_load_never_resets_a_still_valid_name(mode: Mode) {
    let _shared = DESCRIPTORS.read().await;
    let before_hosts = ["stay.test", "gone.test"];
    let after_hosts = ["stay.test", "new.test"];
    let Some(site) = Site::new(&format!("change-{}", mode.flag()), &before_hosts) else {
        return;
    };
    let proxy = site.start(mode, &[]);
    let generation = |s: &Scrape| s.value("ingress_snapshot_generation", &[]);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);

    let load = async {
        let stays =
            futures_util::future::join_all((0..4).map(|_| hammer(&site, "stay.test", true, &stop)));
        let (stays, gone, new) = tokio::join!(
            stays,
            hammer(&site, "gone.test", false, &stop),
            hammer(&site, "new.test", false, &stop)
        );
        let mut stay: BTreeMap<String, usize> = BTreeMap::new();
        for tally in stays {
            for (outcome, count) in tally {
                *stay.entry(outcome).or_default() += count;
            }
        }
        (stay, gone, new)
    };
    let changes = async {
        let mut published = generation(&proxy.scrape());
        // 21 changes, ending on the new hosts, each waited for so every one happens under load.
        for i in 0..21 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            site.write_hosts(if i % 2 == 0 {
                &after_hosts
            } else {
                &before_hosts
            });
            let deadline = Instant::now() + STEP;
            loop {
                let now = generation(&proxy.scrape());
                if now > published {
                    published = now;
                    break;
                }
                assert!(Instant::now() < deadline, "change {i} was not published");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop_tx.send(true).expect("stop");
    };
    let ((stay, gone, new), ()) = tokio::join!(load, changes);
    eprintln!("{mode:?}: stay.test {stay:?}\n  gone.test {gone:?}\n  new.test {new:?}");
    let ok = stay
        .get(&format!("{:?}", Outcome::Served(200)))
        .copied()
        .unwrap_or(0);
    let total: usize = stay.values().sum();
    assert_eq!(
        ok,
        total,
        "stay.test, valid throughout, was not always served: {stay:?}; logs:\n{}",
        proxy.logs()
    );
    assert!(
        total >= 40,
        "too little load to mean anything: {total} connections"
    );
    for (name, tally) in [("gone.test", &gone), ("new.test", &new)] {
        for outcome in tally.keys() {
            assert!(
                outcome == &format!("{:?}", Outcome::Reset) || outcome.starts_with("Served"),
                "{name}: {outcome}"
            );
        }
    }

    // Settled on the new hosts: the added name is served, the removed one is reset.
    assert_eq!(
        site.https_get(MAIN.https, Some("new.test"), "new.test")
            .await,
        Outcome::Served(200)
    );
    assert_eq!(
        site.https_get(MAIN.https, Some("gone.test"), "gone.test")
            .await,
        Outcome::Reset
    );
    let scrape = proxy.scrape();
    assert_eq!(scrape.value("ingress_gate_sync_errors_total", &[]), 0.0);
    if mode == Mode::Ebpf {
        let hosts = bpftool::host_names(site.pins.path());
        assert_eq!(
            hosts,
            BTreeSet::from(["new.test".to_string(), "stay.test".to_string()]),
            "the kernel holds exactly the served names"
        );
    }
}

/// Opens new connections to `name` until `stop`, one after another, and tallies the outcomes.
async fn hammer(
    site: &Site,
    name: &'static str,
    verify: bool,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    let clients = if verify {
        site.clients.clone()
    } else {
        site.clients.unverified()
    };
    while !*stop.borrow() {
        let stream = site.connect(MAIN.https).await;
        let local = stream.local_addr().ok();
        let started = Instant::now();
        let outcome = https_get(stream, &clients, Some(name), name).await;
        if matches!(outcome, Outcome::Failed(_)) {
            eprintln!(
                "{name} from {local:?} failed after {:?}: {outcome:?}",
                started.elapsed()
            );
        }
        *tally.entry(format!("{outcome:?}")).or_default() += 1;
    }
    tally
}
