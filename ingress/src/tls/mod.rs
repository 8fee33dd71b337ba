//! TLS termination: the rustls server configuration, certificate selection by SNI over the
//! published snapshot, and the HTTPS accept path (peek the ClientHello, apply the SNI gate,
//! then hand the bytes to rustls).

pub mod accept;
pub mod certs;
pub mod resolver;
