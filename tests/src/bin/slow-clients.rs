//! Many slow or silent clients of one kind, for the `slow` section of `cargo xtask bench`:
//!
//! ```text
//! slow-clients --kind partial-body --connect 127.0.0.1:19081 --count 5000 --hold 40s
//! ```
//!
//! Each client connects from one of `--sources` loopback addresses (127.1.0.1, 127.1.0.2, …, so a
//! per-client connection cap sees many clients), sends what its kind sends, and then says
//! nothing, until the server closes the connection or `--hold` passes. It prints one JSON
//! object: how many connected, how many the server closed and when (percentiles, from the last
//! byte sent), and how many were still open at the end.
//!
//! Kinds: `h2-cut-preface` (`PRI * HTTP/2.0\r\n` and no more), `h2-settings` (the whole preface
//! and an empty SETTINGS frame), `tls-h2` (a TLS handshake with ALPN `h2`, then nothing),
//! `partial-head` (`GET / HTTP/1.1\r\nHo`), `partial-body` (a head announcing 16 KiB and 15 KiB
//! of it: the largest body the proxy reads whole before it asks the upstream, so the most a
//! slow uploader can make it hold), `streamed-body` (64 KiB announced and 60 KiB sent to
//! `/upload`, which the proxy streams to an upstream that waits for all of it).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::{Parser, ValueEnum};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    H2CutPreface,
    H2Settings,
    TlsH2,
    PartialHead,
    PartialBody,
    StreamedBody,
}

#[derive(Parser, Debug)]
#[command(about = "Many slow or silent clients of one kind, each held until the server closes it")]
struct Args {
    #[arg(long, value_enum)]
    kind: Kind,
    /// The listener (loopback only).
    #[arg(long)]
    connect: SocketAddr,
    #[arg(long)]
    count: usize,
    /// How long a client waits for the server to close it.
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// How many loopback source addresses to spread the clients over.
    #[arg(long, default_value_t = 50)]
    sources: u8,
    /// Connections opened per second.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// The Host (and, for `tls-h2`, the SNI) to name.
    #[arg(long, default_value = "bench.local")]
    host: String,
}

#[derive(Debug)]
enum Outcome {
    /// The connection could not be made or its bytes not sent.
    NotConnected,
    /// The server closed it this long after the last byte was sent.
    Closed(Duration),
    /// Still open when the hold ended.
    Open,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.connect.ip().is_loopback(), "loopback targets only");
    ensure!(args.count <= 100_000, "at most 100000 clients");
    let payload = Arc::new(payload(args.kind, &args.host));
    let tls = (args.kind == Kind::TlsH2).then(|| tokio_rustls::TlsConnector::from(tls_config()));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    let batch = (args.rate / 10).max(1) as usize;
    for i in 0..args.count {
        if i > 0 && i % batch == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sources = u16::from(args.sources.max(1));
        let last = u8::try_from(1 + (i % usize::from(sources)) % 254).unwrap_or(1);
        let source = IpAddr::V4(Ipv4Addr::new(127, 1, 0, last));
        let (payload, tls, host) = (payload.clone(), tls.clone(), args.host.clone());
        let (connect, hold) = (args.connect, args.hold);
        tasks.spawn(async move {
            let Some(stream) = connect_from(source, connect).await else {
                return Outcome::NotConnected;
            };
            match tls {
                Some(tls) => {
                    let Ok(name) = rustls::pki_types::ServerName::try_from(host) else {
                        return Outcome::NotConnected;
                    };
                    match tls.connect(name, stream).await {
                        Ok(stream) => hold_open(stream, &payload, hold).await,
                        Err(_) => Outcome::NotConnected,
                    }
                }
                None => hold_open(stream, &payload, hold).await,
            }
        });
    }
    let opened_in = started.elapsed();
    let mut closed = Vec::new();
    let (mut not_connected, mut open) = (0usize, 0usize);
    while let Some(outcome) = tasks.join_next().await {
        match outcome.context("client task")? {
            Outcome::NotConnected => not_connected += 1,
            Outcome::Closed(after) => closed.push(after),
            Outcome::Open => open += 1,
        }
    }
    closed.sort();
    // Percentiles in whole percent, by index arithmetic (no float-to-index casts).
    let pct = |p: usize| -> f64 {
        if closed.is_empty() {
            return f64::NAN;
        }
        let last = closed.len() - 1;
        closed[(last * p + 50) / 100].as_secs_f64()
    };
    let within = |d: Duration| closed.iter().filter(|c| **c <= d).count();
    println!(
        "{}",
        serde_json::json!({
            "kind": format!("{:?}", args.kind),
            "count": args.count,
            "opened_in_s": opened_in.as_secs_f64(),
            "not_connected": not_connected,
            "closed": closed.len(),
            "closed_within_1s": within(Duration::from_secs(1)),
            "closed_p50_s": pct(50),
            "closed_p99_s": pct(99),
            "closed_max_s": pct(100),
            "still_open": open,
        })
    );
    Ok(())
}

async fn connect_from(source: IpAddr, to: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(source, 0)).ok()?;
    tokio::time::timeout(Duration::from_secs(5), socket.connect(to))
        .await
        .ok()?
        .ok()
}

/// Sends `payload`, then waits for the server to close the connection.
async fn hold_open<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    payload: &[u8],
    hold: Duration,
) -> Outcome {
    if !payload.is_empty() && stream.write_all(payload).await.is_err() {
        return Outcome::NotConnected;
    }
    let _ = stream.flush().await;
    let sent = Instant::now();
    let mut buf = [0u8; 512];
    let until = tokio::time::Instant::now() + hold;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return Outcome::Open,
            Ok(Ok(0)) | Ok(Err(_)) => return Outcome::Closed(sent.elapsed()),
            // Whatever the server says (a 408, a GOAWAY), the question is when it closes.
            Ok(Ok(_)) => {}
        }
    }
}

fn payload(kind: Kind, host: &str) -> Vec<u8> {
    match kind {
        Kind::H2CutPreface => b"PRI * HTTP/2.0\r\n".to_vec(),
        Kind::H2Settings => {
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec()
        }
        Kind::TlsH2 => Vec::new(),
        Kind::PartialHead => b"GET / HTTP/1.1\r\nHo".to_vec(),
        Kind::PartialBody => partial_body("/", host, 16 * 1024, 15 * 1024),
        Kind::StreamedBody => partial_body("/upload", host, 64 * 1024, 60 * 1024),
    }
}

/// A POST head announcing `announced` bytes of body, and `sent` of them.
fn partial_body(path: &str, host: &str, announced: usize, sent: usize) -> Vec<u8> {
    let mut bytes =
        format!("POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {announced}\r\n\r\n")
            .into_bytes();
    bytes.resize(bytes.len() + sent, b'x');
    bytes
}

/// Any certificate will do: the point is the silence after the handshake.
fn tls_config() -> Arc<rustls::ClientConfig> {
    ingress_tests::pki::any_server_config(&[b"h2"])
}
