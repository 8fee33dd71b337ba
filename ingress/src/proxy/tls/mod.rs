//! TLS termination: the rustls server configuration, certificate selection by SNI over the
//! published snapshot, and the HTTPS accept phase (the SNI gate's verdict, then the bytes to
//! rustls, or the stream to a passthrough backend).

pub mod accept;
pub mod resolver;
