//! A bounded flood of new TLS connections for the gate section of `cargo xtask bench`: by
//! default for host names nobody serves, or for one known name from a refused source:
//!
//! ```text
//! sni-flood --connect 127.0.0.1:19744 --rate 1000 --count 3000
//! sni-flood --connect 127.0.0.1:19744 --rate 1000 --count 3000 --name bench.local --bind 198.18.0.2
//! sni-flood ... --name bench.local --bind 198.18.0.2 --request     # the 403 path
//! ```
//!
//! Each connection sends one real ClientHello and waits for the server's reaction: a reset
//! (what the SNI gate does to an unknown name, or to a known name's refused source), a close,
//! bytes, or silence until `--timeout`. The hello is made once by rustls (X25519MLKEM768 key
//! share, ALPN, the usual extensions), then every connection gets a copy with a fresh random name
//! of the same length written over the template's, so no length field changes and making a hello
//! costs next to nothing. With `--name` every copy keeps that name.
//!
//! `--request` is what a proxy without a gate makes of a refused source: each connection
//! completes the handshake (a fresh rustls client each time, the same provider and ALPN
//! `http/1.1`), sends `GET /` for `--name` and reads the status line; a 403 counts as
//! `forbidden`, with its latency from the TCP connect.
//!
//! Connections start at a steady pace, `--rate` per second in 10 ms batches. The run ends after
//! `--count` connections have their outcome, and never later than `--limit`. It prints one
//! JSON object: outcome counts, reset latency percentiles (from the last byte written), and this
//! process's own CPU time during the flood — on loopback that includes the kernel's receive
//! path for what it sends, where an eBPF gate's parser and verdict run.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

/// The template's name: its label is overwritten per connection.
const TEMPLATE_LABEL: &str = "00000000000000000000000000000000";
const TEMPLATE_SUFFIX: &str = ".flood.invalid";
/// Pacing granularity: the timer's resolution is about a millisecond, so batches keep the rate
/// exact without a wake-up per connection.
const BATCH: Duration = Duration::from_millis(10);
const MAX_COUNT: u64 = 1_000_000;

#[derive(Parser, Debug)]
#[command(about = "A bounded flood of TLS connections with random unknown SNI names")]
struct Args {
    /// The proxy's HTTPS listener (loopback only).
    #[arg(long)]
    connect: SocketAddr,
    /// New connections per second.
    #[arg(long)]
    rate: u32,
    /// Connections in total.
    #[arg(long)]
    count: u64,
    /// How long one connection waits to connect, and then for the server's reaction.
    #[arg(long, default_value = "2s", value_parser = duration)]
    timeout: Duration,
    /// A hard limit on the whole run; connections still open then count as unfinished.
    #[arg(long, default_value = "120s", value_parser = duration)]
    limit: Duration,
    /// Send this name in every hello instead of a random unknown one.
    #[arg(long)]
    name: Option<String>,
    /// Connect from this local address (one of this network namespace's), not the default.
    #[arg(long)]
    bind: Option<IpAddr>,
    /// Complete the handshake and request `/` for `--name`, reading the status line.
    #[arg(long, requires = "name")]
    request: bool,
}

fn duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 0.001)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1.0)
    } else {
        (text, 1.0)
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(|v| Duration::from_secs_f64(v * scale))
        .ok_or_else(|| format!("not a duration: {text} (use 500ms or 2s)"))
}

/// How one connection ended.
#[derive(Debug)]
enum Outcome {
    /// ECONNRESET, this long after the hello was written.
    Reset(Duration),
    /// FIN without a byte.
    Closed,
    /// The server sent something (a TLS alert or a ServerHello): it was not rejected as unknown.
    Answered,
    /// `--request`: the response's status code, this long after the TCP connect.
    Status(u16, Duration),
    /// Nothing within the timeout.
    Silent,
    ConnectFailed,
    Error,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.connect.ip().is_loopback(),
        "a flood is only ever aimed at loopback, not {}",
        args.connect
    );
    ensure!(args.rate > 0, "--rate must be positive");
    ensure!(
        (1..=MAX_COUNT).contains(&args.count),
        "--count must be between 1 and {MAX_COUNT}"
    );
    let template = Template::new(args.name.as_deref())?;
    let target = Target {
        addr: args.connect,
        bind: args.bind,
        timeout: args.timeout,
    };
    let request = match (&args.name, args.request) {
        (Some(name), true) => Some(Request::new(name)?),
        _ => None,
    };

    let started = Instant::now();
    let cpu_before = own_cpu()?;
    let deadline = started + args.limit;
    let mut running = JoinSet::new();
    let mut outcomes = Vec::with_capacity(usize::try_from(args.count).unwrap_or(0));
    let mut launched = 0u64;
    let mut ticks = tokio::time::interval(BATCH);
    while launched < args.count && Instant::now() < deadline {
        ticks.tick().await;
        let due = started.elapsed().as_micros() * u128::from(args.rate) / 1_000_000;
        let due = u64::try_from(due).unwrap_or(u64::MAX);
        while launched < due.min(args.count) {
            match &request {
                Some(request) => running.spawn(request.clone().run(target)),
                None => running.spawn(connection(target, template.fresh())),
            };
            launched += 1;
        }
        // Reap as we go so the outcomes vector, not the join set, holds finished work.
        while let Some(done) = running.try_join_next() {
            outcomes.push(done.context("connection task")?);
        }
    }
    let finished = tokio::time::timeout_at(deadline.into(), async {
        while let Some(done) = running.join_next().await {
            outcomes.push(done.context("connection task")?);
        }
        anyhow::Ok(())
    })
    .await;
    let unfinished = running.len();
    running.abort_all();
    if let Ok(result) = finished {
        result?;
    }
    let elapsed = started.elapsed();
    let cpu = own_cpu()?.saturating_sub(cpu_before);

    let mut summary = Summary::default();
    let mut resets = Vec::new();
    let mut forbidden = Vec::new();
    for outcome in &outcomes {
        match outcome {
            Outcome::Reset(after) => {
                summary.reset += 1;
                resets.push(after.as_secs_f64() * 1000.0);
            }
            Outcome::Closed => summary.closed += 1,
            Outcome::Answered => summary.answered += 1,
            Outcome::Status(403, after) => forbidden.push(after.as_secs_f64() * 1000.0),
            Outcome::Status(..) => summary.other_status += 1,
            Outcome::Silent => summary.silent += 1,
            Outcome::ConnectFailed => summary.connect_failed += 1,
            Outcome::Error => summary.error += 1,
        }
    }
    resets.sort_by(f64::total_cmp);
    forbidden.sort_by(f64::total_cmp);
    // Nearest rank; NaN (null in JSON) when nothing was reset.
    let percentile = |sorted: &[f64], permille: usize| -> f64 {
        let rank = sorted.len().saturating_sub(1) * permille / 1000;
        sorted.get(rank).copied().unwrap_or(f64::NAN)
    };
    let report = serde_json::json!({
        "hello_bytes": template.record.len(),
        "launched": launched,
        "reset": summary.reset,
        "closed": summary.closed,
        "answered": summary.answered,
        "forbidden": forbidden.len(),
        "other_status": summary.other_status,
        "silent": summary.silent,
        "connect_failed": summary.connect_failed,
        "error": summary.error,
        "unfinished": unfinished,
        "elapsed_s": elapsed.as_secs_f64(),
        "cpu_ms": cpu.as_secs_f64() * 1000.0,
        "reset_p50_ms": percentile(&resets, 500),
        "reset_p99_ms": percentile(&resets, 990),
        "reset_max_ms": percentile(&resets, 1000),
        "forbidden_p50_ms": percentile(&forbidden, 500),
        "forbidden_p99_ms": percentile(&forbidden, 990),
    });
    println!("{report}");
    Ok(())
}

#[derive(Default)]
struct Summary {
    reset: u64,
    closed: u64,
    answered: u64,
    other_status: u64,
    silent: u64,
    connect_failed: u64,
    error: u64,
}

/// Where and how each connection connects.
#[derive(Clone, Copy)]
struct Target {
    addr: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
}

impl Target {
    /// A TCP connection, closed abortively whatever happens: a flood must not leave TIME_WAIT
    /// sockets behind.
    async fn connect(self) -> Option<TcpStream> {
        let connecting = async {
            let socket = match self.addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            if let Some(ip) = self.bind {
                socket.bind(SocketAddr::new(ip, 0))?;
            }
            socket.connect(self.addr).await
        };
        let stream = tokio::time::timeout(self.timeout, connecting)
            .await
            .ok()?
            .ok()?;
        let _ = stream.set_zero_linger();
        let _ = stream.set_nodelay(true);
        Some(stream)
    }
}

async fn connection(target: Target, hello: Vec<u8>) -> Outcome {
    let timeout = target.timeout;
    let Some(mut stream) = target.connect().await else {
        return Outcome::ConnectFailed;
    };
    if let Err(e) = stream.write_all(&hello).await {
        return match e.kind() {
            std::io::ErrorKind::ConnectionReset => Outcome::Reset(Duration::ZERO),
            _ => Outcome::Error,
        };
    }
    let sent = Instant::now();
    let mut buf = [0u8; 512];
    match tokio::time::timeout(timeout, stream.read(&mut buf)).await {
        Err(_) => Outcome::Silent,
        Ok(Ok(0)) => Outcome::Closed,
        Ok(Ok(_)) => Outcome::Answered,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            Outcome::Reset(sent.elapsed())
        }
        Ok(Err(_)) => Outcome::Error,
    }
}

/// A real ClientHello record and where its name's label sits (none for a fixed `--name`).
struct Template {
    record: Vec<u8>,
    label_at: Option<usize>,
}

impl Template {
    fn new(fixed: Option<&str>) -> anyhow::Result<Template> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("protocol versions")?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let name = match fixed {
            Some(name) => name.to_string(),
            None => format!("{TEMPLATE_LABEL}{TEMPLATE_SUFFIX}"),
        };
        let server_name = ServerName::try_from(name.clone()).context("template name")?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server_name)
            .context("client connection")?;
        let mut record = Vec::new();
        conn.write_tls(&mut record).context("writing the hello")?;
        // One handshake record, whole: what a client sends first.
        let len = record
            .get(3..5)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .unwrap_or(0);
        if record.first() != Some(&0x16) || record.len() != 5 + len {
            bail!(
                "rustls wrote {} bytes that are not one handshake record",
                record.len()
            );
        }
        if fixed.is_some() {
            return Ok(Template {
                record,
                label_at: None,
            });
        }
        let found: Vec<usize> = record
            .windows(name.len())
            .enumerate()
            .filter(|(_, w)| *w == name.as_bytes())
            .map(|(i, _)| i)
            .collect();
        let [label_at] = found.as_slice() else {
            bail!(
                "the template name occurs {} times in the hello",
                found.len()
            );
        };
        Ok(Template {
            record,
            label_at: Some(*label_at),
        })
    }

    /// The hello with a new random label: 128 random bits, so no name repeats or is known.
    /// With a fixed name, the template as it is.
    fn fresh(&self) -> Vec<u8> {
        let mut record = self.record.clone();
        let Some(at) = self.label_at else {
            return record;
        };
        let label = uuid::Uuid::new_v4().simple().to_string();
        if let Some(slot) = record.get_mut(at..at + TEMPLATE_LABEL.len()) {
            slot.copy_from_slice(label.as_bytes());
        }
        record
    }
}

/// `--request`: a full handshake and one request per connection, as a client of a proxy that
/// refuses with 403 sees it.
#[derive(Clone)]
struct Request {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    request: Arc<Vec<u8>>,
}

impl Request {
    fn new(name: &str) -> anyhow::Result<Request> {
        // The certificate is the bench's own self-signed one; what is measured starts after it.
        let config = ingress_tests::pki::any_server_config(&[b"http/1.1"]);
        let server_name = ServerName::try_from(name.to_string()).context("--name")?;
        Ok(Request {
            connector: tokio_rustls::TlsConnector::from(config),
            name: server_name,
            request: Arc::new(
                format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n").into_bytes(),
            ),
        })
    }

    async fn run(self, target: Target) -> Outcome {
        let Some(stream) = target.connect().await else {
            return Outcome::ConnectFailed;
        };
        let connected = Instant::now();
        let exchange = async {
            let mut tls = self.connector.connect(self.name, stream).await?;
            tls.write_all(&self.request).await?;
            // The status line is the first 12 bytes: "HTTP/1.1 403".
            let mut head = [0u8; 12];
            tls.read_exact(&mut head).await?;
            std::io::Result::Ok(head)
        };
        match tokio::time::timeout(target.timeout, exchange).await {
            Err(_) => Outcome::Silent,
            Ok(Ok(head)) => head
                .get(9..12)
                .and_then(|code| std::str::from_utf8(code).ok())
                .and_then(|code| code.parse().ok())
                .map_or(Outcome::Error, |code| {
                    Outcome::Status(code, connected.elapsed())
                }),
            Ok(Err(e)) => match e.kind() {
                std::io::ErrorKind::ConnectionReset => Outcome::Reset(connected.elapsed()),
                std::io::ErrorKind::UnexpectedEof => Outcome::Closed,
                _ => Outcome::Error,
            },
        }
    }
}

/// User plus system CPU of this process so far.
fn own_cpu() -> anyhow::Result<Duration> {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF has no other precondition.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage");
    }
    let micros = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok(micros(usage.ru_utime) + micros(usage.ru_stime))
}
