//! Types shared by the kernel programs and userspace. `no_std`, `#[repr(C)]`, no padding.
//!
//! ```text
//!   sock_ops ──insert──► SOCKS (cookie → socket) ──► stream parser / verdict
//!                                                      │  reads CONFIG, HOSTS, SOURCES
//!                                                      ├─► VERDICTS (cookie → VerdictRecord)
//!                                                      ├─► EVENTS   (GateEvent, ring buffer)
//!                                                      └─► COUNTERS (per-CPU, by `counter::*`)
//!
//!   passthrough: userspace ──insert──► SPLICE_SOCKS (cookie → socket) ──► splice verdict
//!                          ──write───► SPLICES (cookie → SpliceEntry: peer, consumed)
//!                          ──seed────► SPLICE_STATE (cookie → SpliceState)
//!                splice verdict ──► trim bytes already delivered (SpliceState::next_seq),
//!                                   redirect to SPLICE_SOCKS[peer], or pass (passed += len)
//! ```
//!
//! Every type here is read or written through a BPF map by both sides, so each is `#[repr(C)]`,
//! `Copy`, and free of padding (asserted in the tests below): a padding byte would be
//! uninitialised memory in a map key, and two equal keys could hash differently.
#![no_std]

/// The longest `server_name` either side accepts (a DNS name's maximum text length). The
/// userspace parser (`ingress::client_hello::MAX_NAME_LEN`) uses the same bound, and both call a
/// longer name malformed, so no name is ever too long for the kernel but fine for userspace.
pub const MAX_NAME_LEN: usize = 253;

/// Bytes in a [`HostKey`]: room for a wildcard pattern (`*.` + 253) and a terminating NUL, which
/// `bpftool` needs to print the key as a string.
pub const HOST_KEY_LEN: usize = 256;

/// The largest TLS record body (RFC 8446 §5.1); a first record claiming more is malformed.
pub const MAX_FRAGMENT_LEN: u32 = 16384;
/// Bytes in a TLS record header.
pub const RECORD_HEADER_LEN: u32 = 5;
/// The most extensions a ClientHello may carry before it is called malformed; the kernel walk is
/// bounded by it, and the userspace parser shares the bound.
pub const MAX_EXTENSIONS: u32 = 32;
/// How many listener ports one gate can watch.
pub const MAX_PORTS: usize = 8;

/// Connections the kernel keeps state for at once: every per-connection map (SOCKS, VERDICTS,
/// NEXT_MESSAGE, PASSED_EARLY, and the splice maps) is sized from this one number, so none of
/// them fills before another. A connection that finds a map full is decided in userspace
/// instead (`sock_add_failed`, `record_failed`), never left half-gated.
pub const MAX_CONNECTIONS: u32 = 65536;

/// Working memory slots per CPU. A decision runs in softirq or in process context (where it can
/// be preempted by another task's, or interrupted by a softirq's, on the same CPU); each run
/// claims a slot of its own, so no two ever share one. Four covers a preempted run, the run
/// that preempted it, and a softirq on top of each.
pub const WORKSPACE_LEVELS: u32 = 4;

/// What happens to a connection: the one action vocabulary of the gate, in both modes. A
/// HOSTS value holds [`Action::Pass`] or [`Action::Passthrough`] for its name; CONFIG's
/// per-case fields hold [`Action::Pass`] or [`Action::Drop`]; a verdict holds any of them. In
/// maps it is stored as its `u32` (the constants in [`action`]), and read back with
/// [`Action::from_u32`] at the map boundary.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Admitted: userspace terminates TLS and routes the requests.
    Pass = 1,
    /// Admitted, still encrypted, to the backend (TLS passthrough).
    Passthrough = 2,
    /// Reset without reading anything.
    Drop = 3,
    /// The kernel could not decide (no free working memory): the socket is held like a pass,
    /// and userspace reads the first record and applies the policy itself.
    Defer = 4,
}

impl Action {
    pub const fn from_u32(value: u32) -> Option<Action> {
        match value {
            action::PASS => Some(Action::Pass),
            action::PASSTHROUGH => Some(Action::Passthrough),
            action::DROP => Some(Action::Drop),
            action::DEFER => Some(Action::Defer),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Pass => "pass",
            Action::Passthrough => "passthrough",
            Action::Drop => "drop",
            Action::Defer => "defer",
        }
    }
}

/// [`Action`] as map values hold it.
pub mod action {
    use super::Action;

    /// Never written by userspace; the kernel treats it as [`PASS`] so a half-written config
    /// hands decisions to userspace instead of dropping traffic.
    pub const UNSET: u32 = 0;
    pub const PASS: u32 = Action::Pass as u32;
    pub const PASSTHROUGH: u32 = Action::Passthrough as u32;
    pub const DROP: u32 = Action::Drop as u32;
    pub const DEFER: u32 = Action::Defer as u32;
}

/// Why a connection was decided as it was: the one reason vocabulary of the kernel programs,
/// the userspace parser and the metrics (`ingress_sni_gate_total{reason}`,
/// `ingress_ebpf_gate_total{counter}` by reason). Stored as its `u32` ([`reason`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The name is in HOSTS (exactly or through its parent's wildcard) with action pass, or a
    /// catch-all admits it.
    Pass = 1,
    /// The name is in HOSTS with action passthrough.
    Passthrough = 2,
    /// A valid ClientHello whose name is not in HOSTS.
    Unknown = 3,
    /// A valid ClientHello without `server_name`.
    NoSni = 4,
    /// TLS, but not a ClientHello that parses.
    Malformed = 5,
    /// Not TLS at all (plain HTTP, SSLv2, noise).
    NotTls = 6,
    /// A known name whose host's source ranges refuse the client's address.
    SourceRefused = 7,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::Pass,
        Reason::Unknown,
        Reason::NoSni,
        Reason::Malformed,
        Reason::NotTls,
        Reason::Passthrough,
        Reason::SourceRefused,
    ];

    pub const fn from_u32(value: u32) -> Option<Reason> {
        match value {
            reason::PASS => Some(Reason::Pass),
            reason::PASSTHROUGH => Some(Reason::Passthrough),
            reason::UNKNOWN => Some(Reason::Unknown),
            reason::NO_SNI => Some(Reason::NoSni),
            reason::MALFORMED => Some(Reason::Malformed),
            reason::NOT_TLS => Some(Reason::NotTls),
            reason::SOURCE_REFUSED => Some(Reason::SourceRefused),
            _ => None,
        }
    }

    /// A stable label for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Pass => "pass",
            Reason::Passthrough => "passthrough",
            Reason::Unknown => "unknown",
            Reason::NoSni => "no_sni",
            Reason::Malformed => "malformed",
            Reason::NotTls => "not_tls",
            Reason::SourceRefused => "source_refused",
        }
    }
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`Reason`] as map values and events hold it.
pub mod reason {
    use super::Reason;

    pub const PASS: u32 = Reason::Pass as u32;
    pub const PASSTHROUGH: u32 = Reason::Passthrough as u32;
    pub const UNKNOWN: u32 = Reason::Unknown as u32;
    pub const NO_SNI: u32 = Reason::NoSni as u32;
    pub const MALFORMED: u32 = Reason::Malformed as u32;
    pub const NOT_TLS: u32 = Reason::NotTls as u32;
    pub const SOURCE_REFUSED: u32 = Reason::SourceRefused as u32;

    /// A stable label for a stored reason.
    pub const fn as_str(value: u32) -> &'static str {
        match Reason::from_u32(value) {
            Some(reason) => reason.as_str(),
            None => "invalid",
        }
    }
}

/// Indices into the per-CPU COUNTERS array.
pub mod counter {
    /// Verdicts, one per connection, by reason (`reason::X` counts at index `reason::X - 1`).
    pub const PASS: u32 = 0;
    pub const PASSTHROUGH: u32 = 1;
    pub const UNKNOWN: u32 = 2;
    pub const NO_SNI: u32 = 3;
    pub const MALFORMED: u32 = 4;
    pub const NOT_TLS: u32 = 5;
    /// Verdicts whose action was drop, whatever the reason.
    pub const DROPPED: u32 = 6;
    /// Sockets sock_ops put into SOCKS.
    pub const SOCK_ADDED: u32 = 7;
    /// Sockets sock_ops could not put into SOCKS (map full): they reach userspace ungated.
    pub const SOCK_ADD_FAILED: u32 = 8;
    /// Verdicts whose ring-buffer event was lost (buffer full); userspace still finds the
    /// verdict in VERDICTS.
    pub const EVENT_LOST: u32 = 9;
    /// Verdicts that could not be recorded in VERDICTS.
    pub const RECORD_FAILED: u32 = 10;
    /// VERDICTS entries removed by sock_ops when their socket closed.
    pub const RECORD_REAPED: u32 = 11;
    /// First records the stream parser first saw only part of: split over segments, so the
    /// strparser had to wait and reassemble them.
    pub const PARSER_WAITED: u32 = 12;
    /// Messages the splice verdict redirected to the peer socket (passthrough in the kernel).
    pub const SPLICE_REDIRECTED: u32 = 13;
    /// Messages the splice verdict handed to userspace instead: the socket was not armed yet,
    /// or userspace had not caught up with earlier such messages.
    pub const SPLICE_PASSED: u32 = 14;
    /// Redirects that failed because the peer was not in SPLICE_SOCKS; the message went to
    /// userspace.
    pub const SPLICE_NO_PEER: u32 = 15;
    /// Spliced messages that began with bytes the stream had already delivered (a
    /// retransmission overlapping what arrived before), trimmed before they went on.
    pub const SPLICE_TRIMMED: u32 = 16;
    /// Spliced messages whose overlap was too long to trim: the splice is marked broken and
    /// userspace resets both sides rather than forward a duplicate.
    pub const SPLICE_UNTRIMMABLE: u32 = 17;
    /// Messages whose TCP sequence numbers could not be read (a kernel whose `sk_buff` layout
    /// differs from the one this object expects): spliced ones are forwarded untrimmed, and
    /// the parser hands on whole skbs after a verdict.
    pub const SEQ_UNREADABLE: u32 = 18;
    /// Connections the TC program reset before the kernel made a socket for them, by reason
    /// (their verdicts are also counted by reason above, and in DROPPED): the RST left through
    /// the interface the segment came in on. Counted once per connection, when it happened.
    /// Only drops happen there, so pass and passthrough have no slot.
    pub const RESET_BEFORE_ACCEPT_UNKNOWN: u32 = 19;
    pub const RESET_BEFORE_ACCEPT_NO_SNI: u32 = 20;
    pub const RESET_BEFORE_ACCEPT_MALFORMED: u32 = 21;
    pub const RESET_BEFORE_ACCEPT_NOT_TLS: u32 = 22;
    /// Connections the TC program passed before accept, whose socket sock_ops then left out of
    /// SOCKS: no parser, no verdict program, nothing for userspace to take back out.
    pub const PASSED_BEFORE_ACCEPT: u32 = 23;
    /// Connections the TC program refused whose RST it could not send itself (the packet could
    /// not be rewritten or redirected): the request is dropped all the same, and the client
    /// meets the listener's reset when it retransmits.
    pub const EARLY_RESET_UNSENT: u32 = 24;
    /// Data segments on a gated port that the TC program left to the socket path because they
    /// were not the first one the connection expects (a reordered or retransmitted-with-more
    /// segment), or did not start with a whole TLS handshake record.
    pub const EARLY_NOT_FIRST: u32 = 25;
    /// Connections on a gated port that belong to another listener (another process, an
    /// address the proxy does not listen on, a transparent proxy): left alone.
    pub const OTHER_LISTENER: u32 = 26;
    /// Decisions the kernel left to userspace because every working-memory slot of the CPU
    /// was taken (`action::DEFER`).
    pub const DEFERRED: u32 = 27;
    /// Admitted first records the kernel could not hand userspace in their event (the ring
    /// buffer was full, or the message was not a lone record): left in the socket instead.
    pub const UNDELIVERED: u32 = 28;
    /// Verdicts with reason source_refused (a slot of its own: the reasons' slots above are
    /// followed by DROPPED).
    pub const SOURCE_REFUSED: u32 = 29;
    /// Connections the TC program reset before accept because of their source address.
    pub const RESET_BEFORE_ACCEPT_SOURCE_REFUSED: u32 = 30;
    /// Connections refused because they did not start with a valid PROXY protocol header
    /// (`GateConfig::proxy_protocol`); their verdicts also count as malformed and dropped.
    pub const PROXY_HEADER_REFUSED: u32 = 31;
    /// Slots in the array.
    pub const LEN: u32 = 32;

    /// The before-accept counter for a dropped verdict's reason.
    pub const fn reset_before_accept(reason: u32) -> Option<u32> {
        match reason {
            super::reason::UNKNOWN => Some(RESET_BEFORE_ACCEPT_UNKNOWN),
            super::reason::NO_SNI => Some(RESET_BEFORE_ACCEPT_NO_SNI),
            super::reason::MALFORMED => Some(RESET_BEFORE_ACCEPT_MALFORMED),
            super::reason::NOT_TLS => Some(RESET_BEFORE_ACCEPT_NOT_TLS),
            super::reason::SOURCE_REFUSED => Some(RESET_BEFORE_ACCEPT_SOURCE_REFUSED),
            _ => None,
        }
    }

    /// The counter for a verdict's reason.
    pub const fn for_reason(reason: u32) -> u32 {
        if reason == super::reason::SOURCE_REFUSED {
            SOURCE_REFUSED
        } else {
            reason.wrapping_sub(1)
        }
    }

    /// A stable label for each index, for `/metrics`.
    pub const fn as_str(index: u32) -> &'static str {
        match index {
            PASS => "pass",
            PASSTHROUGH => "passthrough",
            UNKNOWN => "unknown",
            NO_SNI => "no_sni",
            MALFORMED => "malformed",
            NOT_TLS => "not_tls",
            DROPPED => "dropped",
            SOCK_ADDED => "sock_added",
            SOCK_ADD_FAILED => "sock_add_failed",
            EVENT_LOST => "event_lost",
            RECORD_FAILED => "record_failed",
            RECORD_REAPED => "record_reaped",
            PARSER_WAITED => "parser_waited",
            SPLICE_REDIRECTED => "splice_redirected",
            SPLICE_PASSED => "splice_passed",
            SPLICE_NO_PEER => "splice_no_peer",
            SPLICE_TRIMMED => "splice_trimmed",
            SPLICE_UNTRIMMABLE => "splice_untrimmable",
            SEQ_UNREADABLE => "seq_unreadable",
            RESET_BEFORE_ACCEPT_UNKNOWN => "reset_before_accept_unknown",
            RESET_BEFORE_ACCEPT_NO_SNI => "reset_before_accept_no_sni",
            RESET_BEFORE_ACCEPT_MALFORMED => "reset_before_accept_malformed",
            RESET_BEFORE_ACCEPT_NOT_TLS => "reset_before_accept_not_tls",
            PASSED_BEFORE_ACCEPT => "passed_before_accept",
            EARLY_RESET_UNSENT => "early_reset_unsent",
            EARLY_NOT_FIRST => "early_not_first",
            OTHER_LISTENER => "other_listener",
            DEFERRED => "deferred",
            UNDELIVERED => "undelivered",
            SOURCE_REFUSED => "source_refused",
            RESET_BEFORE_ACCEPT_SOURCE_REFUSED => "reset_before_accept_source_refused",
            PROXY_HEADER_REFUSED => "proxy_header_refused",
            _ => "invalid",
        }
    }
}

/// The HOSTS key: a lowercased host name or `*.`-wildcard pattern, zero-padded.
///
/// The field is named `name` and the type `HostKey` on purpose: the xtask rewrites this array's
/// BTF element type to a `char` so `bpftool map dump` prints it as a string.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostKey {
    pub name: [u8; HOST_KEY_LEN],
}

/// The HOSTS value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostValue {
    /// [`action::PASS`] or [`action::PASSTHROUGH`].
    pub action: u32,
    /// The host's source policy in SOURCES; 0: the gate does not judge its clients by source
    /// (the proxy's access phase does).
    pub policy: u32,
}

/// Entries the SOURCES trie can hold: every judged policy's ranges, plus two defaults each.
pub const MAX_SOURCE_ENTRIES: u32 = 65536;

/// The data of a SOURCES key (an LPM trie, keyed `{prefixlen: u32, data: SourceData}`): a
/// source policy id, then a client address. The prefix length counts bits from the start of
/// `policy`, so it is always at least [`SourceData::POLICY_BITS`]: a lookup never crosses from
/// one policy into another. IPv4 addresses are keyed v4-mapped (`::ffff:a.b.c.d`, their prefix
/// + 96), as [`FlowKey`] holds them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceData {
    /// The policy id from the host's [`HostValue`]; never 0 (0 means "not judged").
    pub policy: u32,
    /// Network byte order.
    pub addr: [u8; 16],
}

impl SourceData {
    /// The bits of `policy` every key's prefix covers.
    pub const POLICY_BITS: u32 = 32;
    /// A lookup's prefix length: the policy and the whole address.
    pub const FULL_BITS: u32 = 32 + 128;
}

/// A SOURCES value: what the longest matching range says.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceValue {
    /// [`source_verdict::ADMIT`] or [`source_verdict::REFUSE`].
    pub verdict: u32,
}

/// [`SourceValue::verdict`]'s values.
pub mod source_verdict {
    pub const ADMIT: u32 = 1;
    pub const REFUSE: u32 = 2;
}

/// The single CONFIG entry (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GateConfig {
    /// Only sockets in this network namespace are gated (0: every namespace). A cgroup-attached
    /// program also sees every pod's sockets on the node; this keeps it to the proxy's own.
    pub netns_cookie: u64,
    /// The snapshot generation (low 32 bits) this config and HOSTS were written from.
    pub generation: u32,
    /// Non-zero: a name not in HOSTS is admitted (a default backend with a certificate exists).
    pub catch_all: u32,
    /// `action::*` for a valid ClientHello without `server_name`.
    pub no_sni: u32,
    /// `action::*` for TLS that is not a readable ClientHello.
    pub malformed: u32,
    /// `action::*` for bytes that are not TLS at all (plain HTTP to the HTTPS port).
    pub not_tls: u32,
    /// How many entries of `ports` are used.
    pub port_count: u32,
    /// Local ports whose passively established sockets are gated, host byte order.
    pub ports: [u16; MAX_PORTS],
    /// Non-zero: every connection starts with a PROXY protocol header (`--use-proxy-protocol`),
    /// which the programs skip to reach the ClientHello. The client address it names replaces
    /// the peer's for SOURCES (userspace only writes source ranges when it believes every
    /// header, i.e. `proxy-real-ip-cidr` is unset).
    pub proxy_protocol: u32,
    /// Unused; keeps the size a multiple of 8 with no implicit padding.
    pub _reserved: u32,
}

/// The per-socket VERDICTS value, keyed by socket cookie.
///
/// Its presence is also the stream parser's state: once a socket has one, every later byte is
/// passed through unframed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerdictRecord {
    /// `action::PASS`, `PASSTHROUGH` or `DROP`.
    pub action: u32,
    /// `reason::*`.
    pub reason: u32,
    /// [`GateConfig::generation`] at the time of the verdict.
    pub generation: u32,
    /// Bytes the verdict covered: the first TLS record (header included), or for bytes that were
    /// not a framable record, what had arrived. Userspace reads exactly this many. 0: decided
    /// before accept (the TC program passed it), so the socket never joined SOCKS and its bytes
    /// are all in its plain receive queue.
    pub record_len: u32,
    /// Non-zero: the record's bytes were delivered to userspace in the verdict's event (and
    /// dropped from the socket), so userspace takes them from the event, not the socket.
    pub delivered: u32,
}

/// The PASSED_EARLY key: one connection, as the TC program sees its first data segment and as
/// sock_ops sees the socket that segment creates. IPv4 addresses are written v4-mapped, as a
/// dual-stack listener's sockets hold them; `seq` (the client's first data byte, which a new
/// connection with the same addresses would not repeat) keeps a stale entry from ever matching.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Network byte order, as on the wire.
    pub local_ip: [u32; 4],
    pub remote_ip: [u32; 4],
    /// Host byte order.
    pub local_port: u32,
    pub remote_port: u32,
    /// Host byte order.
    pub seq: u32,
}

impl FlowKey {
    /// An IPv4 address (network byte order) as its v4-mapped IPv6 form.
    pub const fn v4_mapped(ip: u32) -> [u32; 4] {
        [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), ip]
    }
}

/// The SPLICES value, keyed by the cookie of a socket in SPLICE_SOCKS: where its bytes go.
///
/// The kernel redirects a message to `peer` only while `consumed` equals the socket's
/// [`SpliceState::passed`] count, i.e. once userspace has forwarded every byte the kernel
/// handed it. Until then it hands messages to userspace too, so bytes leave in the order they
/// arrived whichever path they take. Userspace writes this value; the kernel only reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpliceEntry {
    /// The cookie of the socket this one's bytes are redirected to (also its SPLICE_SOCKS key).
    pub peer: u64,
    /// Bytes userspace has read from this socket and written to the peer;
    /// [`SpliceEntry::UNARMED`] keeps every message in userspace.
    pub consumed: u64,
}

impl SpliceEntry {
    /// A `consumed` no [`SpliceState::passed`] count can reach: the socket's bytes all go to
    /// userspace.
    pub const UNARMED: u64 = u64::MAX;
}

/// The SPLICE_STATE value, keyed by the cookie of a socket in SPLICE_SOCKS: what the splice
/// verdict knows of the socket's stream. Userspace seeds it (all zero) before the socket joins
/// SPLICE_SOCKS and deletes it afterwards; in between only the kernel writes it.
///
/// `next_seq` exists because the kernel hands the verdict whole receive-queue skbs without the
/// offset TCP keeps for a retransmission that overlaps bytes already received (`tcp_read_skb`
/// ignores `copied_seq`): forwarded as they are, those bytes would arrive twice.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SpliceState {
    /// Bytes handed to userspace (the socket's own receive queue) rather than redirected.
    pub passed: u64,
    /// The TCP sequence number of the next byte the stream has not delivered yet; a message
    /// starting before it is trimmed to it. Valid once `seq_known` is non-zero.
    pub next_seq: u32,
    /// Non-zero once `next_seq` was taken from a message.
    pub seq_known: u32,
    /// Non-zero once a message could not be trimmed: every later message is dropped, and
    /// userspace resets both sockets.
    pub broken: u32,
    pub _reserved: u32,
}

/// Working memory for one ClientHello decision: the lookup keys and the duplicate-extension
/// bookkeeping. Each decision claims a slot of its own (per CPU, `WORKSPACE_LEVELS` of them;
/// see the eBPF crate's `work.rs`) and leaves `seen` all zero when it releases it, so at rest
/// every slot's `seen` is zero and no slot is claimed: userspace reads both back to check.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Workspace {
    /// The exact-name lookup key.
    pub key: HostKey,
    /// The `*.parent` lookup key.
    pub wild: HostKey,
    /// The client's address (v4-mapped, network byte order), set by the caller before each
    /// decision, for the SOURCES lookup.
    pub client: [u8; 16],
    /// The extension types recorded in `seen`, in order, to clear them afterwards.
    pub types: [u16; MAX_EXTENSIONS as usize],
    /// One bit per extension type; all zero between runs.
    pub seen: [u64; SEEN_WORDS],
    /// Where the verdict assembles what it hands userspace.
    pub delivery: Delivery,
}

/// A verdict event followed by the first record's bytes, as the stream verdict writes it to the
/// ring buffer for a connection it admits: userspace gets the ClientHello from here, and the
/// kernel drops it from the socket. Why not leave it in the socket for userspace to read:
/// bytes a stream verdict passes to the socket are counted as read twice when another parser
/// run happens before userspace reads them (`tcp_bpf_strp_read_sock` on Linux 6.14 and later),
/// which leaves the socket's read position past its data, and the next bytes the client sends
/// never wake the reader. Only the first `size_of::<GateEvent>() + payload_len` bytes go into
/// the ring.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Delivery {
    pub event: GateEvent,
    pub record: [u8; DELIVERY_BYTES],
}

/// Words in [`Workspace::seen`]: one bit for each of the 65,536 extension types.
pub const SEEN_WORDS: usize = 65536 / 64;

/// A ring-buffer event, one per verdict.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GateEvent {
    pub cookie: u64,
    pub action: u32,
    pub reason: u32,
    /// Keeps the event a whole number of the ring buffer's 8-byte slots.
    pub _reserved: u32,
    pub generation: u32,
    pub record_len: u32,
    /// `AF_INET` or `AF_INET6`.
    pub family: u32,
    /// Host byte order.
    pub local_port: u32,
    /// Host byte order.
    pub remote_port: u32,
    /// IPv4 in the first word, as the kernel's `__sk_buff` holds it (network byte order).
    pub local_ip: [u32; 4],
    pub remote_ip: [u32; 4],
    /// Bytes of `name` used; 0 when there was no readable name.
    pub name_len: u32,
    /// Bytes of the first record that follow this event in the ring buffer (see
    /// [`Delivery`]); 0 when the record stays in the socket.
    pub payload_len: u32,
    /// The lowercased `server_name`, zero-padded.
    pub name: [u8; HOST_KEY_LEN],
}

/// The largest first record: a header and a maximal fragment.
pub const MAX_RECORD_LEN: u32 = RECORD_HEADER_LEN + MAX_FRAGMENT_LEN;
/// The longest PROXY protocol header the kernel hands userspace with the record behind it: a
/// v1 line is at most 107 bytes, a v2 header 16 plus its addresses (216 for AF_UNIX) and TLVs.
/// A longer (valid) header is still skipped and judged; its bytes then stay in the socket.
pub const MAX_DELIVERED_PROXY_HEADER: u32 = 256;
/// The longest PROXY protocol header either parser accepts (`proxy_protocol::MAX_HEADER` in
/// userspace): a v2 length field past `MAX_PROXY_HEADER - 16` is refused.
pub const MAX_PROXY_HEADER: u32 = 4096;
/// The longest message the verdict delivers in its event: a PROXY header and a maximal record.
pub const MAX_DELIVERY_LEN: u32 = MAX_DELIVERED_PROXY_HEADER + MAX_RECORD_LEN;
/// [`Delivery::record`]'s size: [`MAX_DELIVERY_LEN`] rounded up to 8 bytes.
pub const DELIVERY_BYTES: usize = (MAX_DELIVERY_LEN as usize + 7) & !7;

impl HostKey {
    pub const EMPTY: HostKey = HostKey {
        name: [0; HOST_KEY_LEN],
    };

    /// The key for a host name or `*.`-pattern, lowercased; `None` if it is empty, does not fit
    /// (leaving a NUL), or holds a NUL itself. Content is not validated further: a name the
    /// kernel can never produce is harmless in the map.
    pub fn new(name: &[u8]) -> Option<HostKey> {
        if name.is_empty() || name.len() >= HOST_KEY_LEN || name.contains(&0) {
            return None;
        }
        let mut key = HostKey::EMPTY;
        for (slot, b) in key.name.iter_mut().zip(name) {
            *slot = b.to_ascii_lowercase();
        }
        Some(key)
    }

    /// The name without its zero padding.
    pub fn as_bytes(&self) -> &[u8] {
        let len = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(HOST_KEY_LEN);
        self.name.split_at(len).0
    }
}

impl core::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match core::str::from_utf8(self.as_bytes()) {
            Ok(s) => write!(f, "HostKey({s:?})"),
            Err(_) => write!(f, "HostKey({:?})", self.as_bytes()),
        }
    }
}

impl GateEvent {
    /// The name without its zero padding.
    pub fn name(&self) -> &[u8] {
        let len = usize::try_from(self.name_len)
            .unwrap_or(0)
            .min(HOST_KEY_LEN);
        self.name.split_at(len).0
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;

    /// One `unsafe impl aya::Pod` per type, under the one comment that justifies them all.
    macro_rules! pod {
        ($($ty:ty),+ $(,)?) => {$(
            // SAFETY: every type listed is #[repr(C)], Copy, built only of integers and integer
            // arrays, and has no padding (see the size tests below), so any bit pattern is a
            // valid value.
            unsafe impl aya::Pod for $ty {}
        )+};
    }

    pod!(
        HostKey,
        HostValue,
        SourceData,
        SourceValue,
        GateConfig,
        VerdictRecord,
        GateEvent,
        SpliceEntry,
        SpliceState,
        FlowKey,
        Workspace,
        Delivery,
    );
}

#[cfg(test)]
mod tests {
    use core::mem::{align_of, size_of};

    use super::*;

    /// The sum of the field sizes equals the type's size, so there is no padding anywhere.
    #[test]
    fn types_have_no_padding() {
        let cases: [(&str, usize, usize, usize); 11] = [
            ("HostKey", size_of::<HostKey>(), HOST_KEY_LEN, 1),
            ("HostValue", size_of::<HostValue>(), 4 + 4, 4),
            ("SourceData", size_of::<SourceData>(), 4 + 16, 4),
            ("SourceValue", size_of::<SourceValue>(), 4, 4),
            (
                "GateConfig",
                size_of::<GateConfig>(),
                8 + 4 * 6 + 2 * MAX_PORTS + 4 * 2,
                8,
            ),
            ("VerdictRecord", size_of::<VerdictRecord>(), 4 * 5, 4),
            (
                "GateEvent",
                size_of::<GateEvent>(),
                8 + 4 * 8 + 16 * 2 + 4 * 2 + HOST_KEY_LEN,
                8,
            ),
            ("SpliceEntry", size_of::<SpliceEntry>(), 8 + 8, 8),
            ("SpliceState", size_of::<SpliceState>(), 8 + 4 * 4, 8),
            ("FlowKey", size_of::<FlowKey>(), 4 * 11, 4),
            (
                "Workspace",
                size_of::<Workspace>(),
                2 * HOST_KEY_LEN
                    + 16
                    + 2 * MAX_EXTENSIONS as usize
                    + 8 * SEEN_WORDS
                    + size_of::<GateEvent>()
                    + DELIVERY_BYTES,
                8,
            ),
        ];
        let aligns = [
            align_of::<HostKey>(),
            align_of::<HostValue>(),
            align_of::<SourceData>(),
            align_of::<SourceValue>(),
            align_of::<GateConfig>(),
            align_of::<VerdictRecord>(),
            align_of::<GateEvent>(),
            align_of::<SpliceEntry>(),
            align_of::<SpliceState>(),
            align_of::<FlowKey>(),
            align_of::<Workspace>(),
        ];
        for ((name, size, fields, align), actual_align) in cases.into_iter().zip(aligns) {
            assert_eq!(size, fields, "{name} has padding");
            assert_eq!(actual_align, align, "{name} alignment");
            assert_eq!(size % align, 0, "{name} tail padding");
        }
    }

    #[test]
    fn ring_buffer_event_fits_its_8_byte_slots() {
        assert!(align_of::<GateEvent>() <= 8);
        assert_eq!(size_of::<GateEvent>() % 8, 0);
        assert_eq!(
            size_of::<Delivery>(),
            size_of::<GateEvent>() + DELIVERY_BYTES,
            "the record follows the event with no gap"
        );
        assert!(DELIVERY_BYTES >= MAX_RECORD_LEN as usize);
    }

    /// A per-CPU map value may not exceed 32 KiB (PCPU_MIN_UNIT_SIZE).
    #[test]
    fn a_workspace_fits_a_per_cpu_slot() {
        assert!(
            size_of::<Workspace>() <= 32 * 1024,
            "{}",
            size_of::<Workspace>()
        );
    }

    #[test]
    fn host_key_lowercases_and_rejects_what_cannot_fit() {
        let cases: [(&[u8], Option<&[u8]>); 6] = [
            (b"Example.COM", Some(b"example.com")),
            (b"*.example.com", Some(b"*.example.com")),
            (b"", None),
            (b"a\0b", None),
            (&[b'a'; HOST_KEY_LEN - 1], Some(&[b'a'; HOST_KEY_LEN - 1])),
            (&[b'a'; HOST_KEY_LEN], None),
        ];
        for (input, want) in cases {
            let got = HostKey::new(input);
            assert_eq!(got.as_ref().map(HostKey::as_bytes), want, "input {input:?}");
        }
    }

    #[test]
    fn a_key_is_zero_padded_so_equal_names_are_equal_keys() {
        let a = HostKey::new(b"a.example").map(|k| k.name);
        let b = HostKey::new(b"A.EXAMPLE").map(|k| k.name);
        assert_eq!(a, b);
        assert!(a.is_some_and(|name| name[9..].iter().all(|&b| b == 0)));
    }

    #[test]
    fn every_reason_has_its_own_counter_and_label() {
        let reasons = [
            reason::PASS,
            reason::PASSTHROUGH,
            reason::UNKNOWN,
            reason::NO_SNI,
            reason::MALFORMED,
            reason::NOT_TLS,
        ];
        let mut seen = [false; counter::LEN as usize];
        for r in reasons {
            let index = counter::for_reason(r);
            assert!(
                index < counter::DROPPED,
                "reason {r} maps past the reason counters"
            );
            assert!(!seen[index as usize], "two reasons share counter {index}");
            seen[index as usize] = true;
            assert_eq!(reason::as_str(r), counter::as_str(index));
        }
        for index in 0..counter::LEN {
            assert_ne!(
                counter::as_str(index),
                "invalid",
                "counter {index} has no label"
            );
        }
    }
}
