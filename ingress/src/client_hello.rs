//! A pure, fuzzable TLS ClientHello parser.
