//! What the proxy is configured with, from flags: per request ([`ProxySettings`]) and per
//! client connection ([`HttpSettings`]). What the ConfigMap can change (timeouts to upstreams,
//! HSTS, forwarded headers, underscores, `Server`) is read from each request's snapshot
//! instead (`snapshot::global`).

use std::time::Duration;

use ingress_wire::target::PathSettings;

use super::access_log::AccessFormat;
use super::log_lines::LogLines;
use super::phase::tls::NoSniRequests;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// The most a client may pause while sending a request body (`client_body_timeout`).
    pub client_body_timeout: Duration,
    /// The most a write to the client may stall (`send_timeout`).
    pub client_send_timeout: Duration,
    pub access_log: bool,
    /// `--access-log-format`: an event with fields, its JSON line, or ingress-nginx's
    /// `upstream` line.
    pub access_format: AccessFormat,
    /// Where the `json` and `upstream` lines are written (the process's log); without it,
    /// only `text` events are.
    pub log_lines: Option<LogLines>,
    /// The HTTPS port clients use, for redirect locations.
    pub https_port: u16,
    pub paths: PathSettings,
    pub no_sni_requests: NoSniRequests,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            client_body_timeout: Duration::from_secs(60),
            client_send_timeout: Duration::from_secs(60),
            access_log: true,
            access_format: AccessFormat::Event,
            log_lines: None,
            https_port: 443,
            paths: PathSettings::default(),
            no_sni_requests: NoSniRequests::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// A request head must arrive whole within this of its first byte (and an HTTP/2
    /// connection must start a request within it).
    pub header_read_timeout: Duration,
    pub max_header_size: usize,
    /// How long a connection may wait for its next request (nginx's `keepalive_timeout`).
    pub keepalive_timeout: Duration,
    /// How often an HTTP/2 connection is PINGed to find dead peers.
    pub http2_ping_interval: Duration,
    /// How long a PING may go unanswered.
    pub http2_ping_timeout: Duration,
}
