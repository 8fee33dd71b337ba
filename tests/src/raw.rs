//! Raw HTTP/1.x over a socket, for tests that must send exact bytes (smuggling, malformed heads,
//! slow clients) and read exactly what comes back, over plain TCP or TLS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One response as a client reads it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// What the echo backend said it received.
    pub fn echo(&self) -> crate::upstream::Echo {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("not an echo ({err}): {}", self.text()))
    }
}

/// A byte stream a test talks HTTP/1.x over.
pub trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

/// A client connection that sends raw bytes and reads whole responses.
pub struct RawConn {
    reader: BufReader<Box<dyn Wire>>,
}

impl RawConn {
    /// Plain TCP, with a read timeout so a test fails instead of hanging.
    pub fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect(addr).unwrap_or_else(|err| panic!("connect {addr}: {err}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        RawConn {
            reader: BufReader::new(Box::new(stream)),
        }
    }

    /// Plain TCP from a chosen local address (another loopback address, say: a second
    /// client as far as the peer address goes).
    pub fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> RawConn {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).expect("socket");
        socket
            .bind(&SocketAddr::new(source, 0).into())
            .unwrap_or_else(|err| panic!("bind {source}: {err}"));
        socket
            .connect(&addr.into())
            .unwrap_or_else(|err| panic!("connect {addr} from {source}: {err}"));
        let stream: TcpStream = socket.into();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        RawConn {
            reader: BufReader::new(Box::new(stream)),
        }
    }

    /// TLS with `sni` (or none), trusting `config`'s roots.
    pub fn connect_tls(
        addr: SocketAddr,
        sni: Option<&str>,
        config: Arc<rustls::ClientConfig>,
    ) -> RawConn {
        let stream = TcpStream::connect(addr).unwrap_or_else(|err| panic!("connect {addr}: {err}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut config = (*config).clone();
        let name = match sni {
            Some(name) => {
                rustls::pki_types::ServerName::try_from(name.to_string()).expect("server name")
            }
            None => {
                // An IP address as the name: rustls sends no SNI for it.
                config.enable_sni = false;
                rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).expect("ip")
            }
        };
        let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("TLS client");
        RawConn {
            reader: BufReader::new(Box::new(rustls::StreamOwned::new(conn, stream))),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let stream = self.reader.get_mut();
        stream.write_all(bytes).expect("send");
        stream.flush().expect("flush");
    }

    /// Sends, then reads one response.
    pub fn exchange(&mut self, bytes: &[u8]) -> Reply {
        self.send(bytes);
        self.reply()
    }

    /// Bytes that are not HTTP (after an upgrade, say).
    pub fn read_exact(&mut self, buf: &mut [u8]) {
        self.reader.read_exact(buf).expect("read");
    }

    pub fn reply(&mut self) -> Reply {
        read_reply(&mut self.reader, false)
    }

    pub fn reply_to_head(&mut self) -> Reply {
        read_reply(&mut self.reader, true)
    }

    /// Whether the server closes the connection (end of stream or reset) within `within`,
    /// discarding anything it sends first. Returns how long it took.
    pub fn closes_within(&mut self, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => return Some(started.elapsed()),
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return Some(started.elapsed()),
            }
            if started.elapsed() > within {
                return None;
            }
        }
    }
}

/// Sends `bytes` on a new connection and reads one response.
pub fn exchange(addr: SocketAddr, bytes: &[u8]) -> Reply {
    RawConn::connect(addr).exchange(bytes)
}

/// `GET path` for `host`.
pub fn get(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

/// Reads one response, decoding whichever framing it has.
pub fn read_reply<R: BufRead>(reader: &mut R, head_request: bool) -> Reply {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status in {line:?}"))
        .parse()
        .expect("numeric status");
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).expect("header line");
        if header == "\r\n" || header.is_empty() {
            break;
        }
        let (n, v) = header.split_once(':').expect("a header line");
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_request || status < 200 || status == 204 || status == 304 {
        return reply;
    }
    let chunked = reply
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().ends_with("chunked"));
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).expect("chunk size");
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .expect("hex chunk size");
            if size == 0 {
                // Trailers, then the empty line.
                loop {
                    let mut t = String::new();
                    reader.read_line(&mut t).expect("trailer");
                    if t == "\r\n" || t.is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).expect("chunk");
            reply.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = reply.header("content-length") {
        let mut body = vec![0; len.parse().expect("numeric length")];
        reader.read_exact(&mut body).expect("body");
        reply.body = body;
    } else {
        reader
            .read_to_end(&mut reply.body)
            .expect("body until close");
    }
    reply
}
