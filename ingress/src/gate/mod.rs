//! The kernel SNI gate: loading, map sync and per-connection verdicts (eBPF via aya).
