//! Parsers for bytes that arrive from the network, and writers for the bytes sent on: pure
//! functions, no I/O, so each is table-tested here and fuzzed on its own (`ingress/fuzz`).
//!
//! ```text
//!   header     what the proxy does with a header, by name (hop-by-hop, set by the proxy, …)
//!   request    an HTTP/1.x request head → RequestHead, or the status that refuses it;
//!              and the head the upstream is sent
//!   response   what an upstream's response head says about its framing and connection
//!   chunked    where a chunked body ends, and which of its bytes are data
//!   target     a request target → the normalised path that is routed and forwarded
//!   authority  a Host or :authority → the one host routed and forwarded
//! ```
//!
//! Every input here may be hostile: nothing panics on any input, nothing allocates without a
//! bound, and anything ambiguous is refused rather than guessed at.

pub mod authority;
pub mod chunked;
#[cfg(feature = "differential")]
pub mod differential;
pub mod header;
pub mod request;
pub mod response;
pub mod target;
