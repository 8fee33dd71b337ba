//! An upstream that answers each request with exactly the bytes a test's script returns, so a
//! test can send the proxy any response head a real (or broken) server might: odd statuses,
//! both framing headers, codings, early answers, or a close.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One request as the scripted upstream read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// How many requests this connection served before this one.
    pub served_on_connection: usize,
    /// Which connection it came on: 1 for the first one accepted, and so on.
    pub connection: usize,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What to do with a request.
pub enum Answer {
    /// Write these bytes, and keep the connection for the next request.
    Bytes(Vec<u8>),
    /// Write these bytes, then close.
    BytesThenClose(Vec<u8>),
    /// Close without answering.
    Close,
}

type Script = dyn Fn(&Seen) -> Answer + Send + Sync;

pub struct Scripted {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Scripted {
    pub fn start(script: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Scripted {
        let listener = crate::ports::listen_loopback();
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let (conns, reqs) = (connections.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let connection = conns.fetch_add(1, Ordering::SeqCst) + 1;
                let (script, reqs) = (script.clone(), reqs.clone());
                std::thread::spawn(move || serve(stream, connection, &*script, &reqs));
            }
        });
        Scripted {
            addr,
            connections,
            requests,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests read so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, connection: usize, script: &Script, requests: &AtomicUsize) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut out = stream;
    let mut served = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let body =
            if header("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
                match read_chunked(&mut reader) {
                    Some(body) => body,
                    None => return,
                }
            } else {
                let length = header("content-length")
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                body
            };
        requests.fetch_add(1, Ordering::SeqCst);
        let seen = Seen {
            method,
            path,
            headers,
            body,
            served_on_connection: served,
            connection,
        };
        match script(&seen) {
            Answer::Bytes(bytes) => {
                if out.write_all(&bytes).is_err() {
                    return;
                }
            }
            Answer::BytesThenClose(bytes) => {
                let _ = out.write_all(&bytes);
                return;
            }
            Answer::Close => return,
        }
        served += 1;
    }
}

fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).ok()?;
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            loop {
                let mut trailer = String::new();
                reader.read_line(&mut trailer).ok()?;
                if trailer == "\r\n" {
                    return Some(body);
                }
            }
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        body.extend_from_slice(&chunk[..size]);
    }
}

/// A 200 with `text` as its body.
pub fn ok(text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )
    .into_bytes()
}
