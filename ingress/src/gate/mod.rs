//! The kernel SNI gate: loading, map sync and per-connection verdicts (eBPF via aya).
//!
//! ```text
//!   Gate::load ── lock pin_dir ── object (embedded) ──► maps pinned under pin_dir ──► sk_skb on
//!              │  (one owner)     request-sock offsets   hosts config counters     SOCKS, sock_ops
//!              │                  from the kernel's BTF  (kept across restarts)    on the cgroup,
//!              │                                         socks verdicts … (replaced) gate_early first
//!              │                                                                   on each TCX hook
//!   register_listener(fd) ──► LISTENERS[fd]: the proxy's listener, cloned to its children
//!              └► events task ──────┐
//!                                   ├─ drain EVENTS ──► the waiter (by cookie), else the early table
//!   accept() ──► screen(): SO_COOKIE ┘   then take the early verdict, if the kernel has decided
//!                (it usually has: the HTTPS listener defers accept until the first bytes arrive)
//!            ──► admit(): the early verdict, or register, peek kick, check VERDICTS, await
//!                 ├ Drop        → reset: SO_LINGER 0 + close = RST, nothing read
//!                 ├ Pass        → take_first_record(): read it, leave SOCKS, delete the
//!                 │               socket's records, hand bytes to TLS (passed before accept:
//!                 │               nothing to take; the caller checks the name again)
//!                 ├ Passthrough → same; then splice(): both sockets into SPLICE_SOCKS, and
//!                 │               the kernel moves the bytes (see splice.rs)
//!                 ├ Deferred    → the kernel could not decide: take the record, decide in
//!                 │               userspace
//!                 ├ Ungated     → sock_ops did not gate it: decide in userspace
//!                 └ Timeout     → no whole first record in time
//!   sync_hosts() ── plan() (pure) ──► upserts, config, removals: never a gap for a known name
//! ```
//!
//! Verdict records are deleted by userspace once admission is over, and by the kernel when a
//! socket closes before that (sock_ops state callback); VERDICTS is a plain hash sized like
//! SOCKS, so a record in use is never evicted. Waiters are removed when their `admit`
//! returns, whatever the outcome; early verdicts when taken, or after a time to live.
//!
//! Needs a tokio runtime (the events task) and, for the kernel, root or CAP_BPF + CAP_NET_ADMIN.

pub mod btf;
mod conn;
mod early;
mod events;
mod load;
pub mod policy;
mod splice;
mod sys;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf, SkStorage, SockHash};
use ingress_common::{GateEvent, HostKey, HostValue, VerdictRecord, action};

// aya's syscall errors keep the errno in a source: errors are shown with their chain.
use crate::errors::chain;
use crate::snapshot::sni::SniPolicy;

pub use conn::Screened;
pub use early::{EarlyReset, Shadowed};
pub use ingress_common::counter;
pub use ingress_common::{Action, Reason};
pub use policy::{SyncPlan, plan};
pub use splice::{
    PinnedSpliceEntries, Progress, Splice, SpliceEnd, SpliceStep, Unspliced, pinned_entries,
};

/// The decision workspaces of a gate, read from their pins (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedWorkspaces {
    /// Slots (per CPU × level).
    pub slots: usize,
    /// Slots claimed now: 0 at rest.
    pub claimed: usize,
    /// Words of duplicate-extension bits left set: 0 at rest, always.
    pub dirty_words: usize,
}

/// Reads the workspaces and their claim flags pinned under `pin_dir`.
pub fn pinned_workspaces(pin_dir: &std::path::Path) -> Result<PinnedWorkspaces> {
    use aya::maps::Map;
    let open = |name: &'static str| {
        MapData::from_pin(pin_dir.join(name)).map_err(|source| GateError::Map { name, source })
    };
    let busy: PerCpuArray<MapData, u32> =
        PerCpuArray::try_from(Map::PerCpuArray(open(pins::WORKSPACE_BUSY)?)).map_err(|source| {
            GateError::Map {
                name: "BUSY",
                source,
            }
        })?;
    let work: PerCpuArray<MapData, ingress_common::Workspace> =
        PerCpuArray::try_from(Map::PerCpuArray(open(pins::WORKSPACES)?)).map_err(|source| {
            GateError::Map {
                name: "WORKSPACES",
                source,
            }
        })?;
    let mut seen = PinnedWorkspaces::default();
    for level in 0..ingress_common::WORKSPACE_LEVELS {
        let flags = busy.get(&level, 0).map_err(|source| GateError::Map {
            name: "BUSY",
            source,
        })?;
        let slots = work.get(&level, 0).map_err(|source| GateError::Map {
            name: "WORKSPACES",
            source,
        })?;
        for (flag, slot) in flags.iter().zip(slots.iter()) {
            seen.slots += 1;
            seen.claimed += usize::from(*flag != 0);
            seen.dirty_words += slot.seen.iter().filter(|w| **w != 0).count();
        }
    }
    Ok(seen)
}

/// The eBPF object built by `cargo xtask build-ebpf`, or `None` in a userspace-only build.
#[cfg(ebpf_embedded)]
pub static EMBEDDED_OBJECT: Option<&'static [u8]> = Some(aya::include_bytes_aligned!(env!(
    "INGRESS_EBPF_OBJECT_PATH"
)));
/// The eBPF object built by `cargo xtask build-ebpf`, or `None` in a userspace-only build.
#[cfg(not(ebpf_embedded))]
pub static EMBEDDED_OBJECT: Option<&'static [u8]> = None;

/// Where maps are pinned unless told otherwise.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ingress";

/// Pin file names under the pin directory (the kernel's map names are the upper-case statics).
pub mod pins {
    /// Kept across restarts: the policy and the counters.
    pub const HOSTS: &str = "hosts";
    /// Each judged host's source ranges (an LPM trie), by the policy id in its HOSTS value.
    pub const SOURCES: &str = "sources";
    pub const CONFIG: &str = "config";
    pub const COUNTERS: &str = "counters";
    /// Replaced on every load: per-socket state of the previous process means nothing now.
    pub const VERDICTS: &str = "verdicts";
    pub const SOCKS: &str = "socks";
    /// Spliced passthrough sockets, their peers, and what the kernel knows of each stream.
    pub const SPLICE_SOCKS: &str = "splice_socks";
    pub const SPLICES: &str = "splices";
    pub const SPLICE_STATE: &str = "splice_state";
    /// Connections the TC program passed before their socket existed, until sock_ops takes
    /// the verdict.
    pub const PASSED_EARLY: &str = "passed_early";
    /// Each CPU's decision workspaces and their claim flags (all free and clean at rest).
    pub const WORKSPACES: &str = "workspaces";
    pub const WORKSPACE_BUSY: &str = "workspace_busy";
}

pub type Result<T, E = GateError> = std::result::Result<T, E>;

/// Why the gate could not load or act. The caller falls back to userspace mode on load errors.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("this binary carries no eBPF object (build it with `cargo xtask build`)")]
    NotEmbedded,
    #[error("reading the eBPF object {path}: {source}")]
    ReadObject {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kernel exposes no BTF at /sys/kernel/btf/vmlinux")]
    NoKernelBtf,
    #[error("gate needs between 1 and {max} HTTPS ports, got {0}", max = ingress_common::MAX_PORTS)]
    Ports(usize),
    #[error("pin directory: {0}")]
    PinDir(String),
    #[error(
        "pin directory {dir} is in use by another ingress process{}; give each instance its own --bpf-pin-dir",
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    PinDirInUse { dir: PathBuf, holder: Option<u32> },
    #[error("pinned map {path}: {reason}")]
    Pin { path: PathBuf, reason: String },
    #[error("cgroup v2: {0}")]
    Cgroup(String),
    #[error("opening cgroup {path}: {source}")]
    OpenCgroup {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading this thread's network namespace cookie: {0}")]
    Netns(std::io::Error),
    #[error("loading the eBPF object: {}", chain(.0.as_ref()))]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    #[error("kernel {0} can send part of a redirected message twice; not splicing")]
    SpliceDuplicates(String),
    #[error("map {name}: {}", chain(source))]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("program {name}: {}", chain(source))]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("the gate needs a tokio runtime")]
    NoRuntime,
    #[error("socket: {0}")]
    Socket(std::io::Error),
    #[error("the peer closed after {read} of {want} bytes of the first record")]
    Closed { read: usize, want: usize },
    #[error("the first record did not arrive within {0:?}")]
    RecordTimeout(Duration),
    #[error(
        "the kernel discarded {} bytes the client sent behind its first record (received {received}, read {read}, queued {queued})",
        received.saturating_sub(read + queued)
    )]
    Discarded {
        received: u64,
        read: u64,
        queued: u64,
    },
    #[error("the kernel delivered the first record in an event that never arrived")]
    RecordLost,
    #[error(
        "the socket's read position is {0} bytes past its data (a kernel accounting fault); the connection cannot be served"
    )]
    ReadPastData(u64),
    #[error("probe input of {0} bytes is larger than a test run takes")]
    ProbeTooLarge(usize),
    #[error("probe: {0}")]
    Probe(std::io::Error),
    #[error("early reset: {0}")]
    EarlyReset(String),
}

/// Where and how to load. `Default` is the production layout with no ports.
#[derive(Clone, Debug)]
pub struct GateOptions {
    /// An object file to load instead of the embedded one.
    pub object: Option<PathBuf>,
    pub pin_dir: PathBuf,
    /// The cgroup v2 directory to attach sock_ops to; `None`: the one this process runs in.
    pub cgroup: Option<PathBuf>,
    pub https_ports: Vec<u16>,
    /// The policy to write at load; `None` leaves the pinned HOSTS (and CONFIG's policy) as a
    /// previous run left them until the first `sync_hosts`.
    pub policy: Option<SniPolicy>,
    /// Gate only sockets in this network namespace; `None`: the calling thread's.
    pub netns_cookie: Option<u64>,
    /// How long `admit` waits for a verdict and `take_first_record` for the record's bytes.
    pub verdict_timeout: Duration,
    /// Whether the programs log (aya-log, forwarded to `tracing` as `ingress::gate::kernel`).
    pub kernel_log: KernelLog,
    /// Where the TC program resets connections before accept.
    pub early_reset: EarlyReset,
    /// `--use-proxy-protocol`: every connection on the gated ports starts with a PROXY
    /// protocol header, which the programs skip (and whose client they judge source ranges by).
    /// Only until the first snapshot is synced: from then on the snapshot's `SniPolicy` says
    /// (the ConfigMap's `use-proxy-protocol` may change it).
    pub proxy_protocol: bool,
}

/// Kernel-side logging, fixed at load: disabled log calls are removed by the verifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KernelLog {
    /// On if `tracing` has debug enabled for `ingress::gate::kernel` when the gate loads.
    #[default]
    FromTracing,
    Off,
    Debug,
}

impl Default for GateOptions {
    fn default() -> Self {
        GateOptions {
            object: None,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            cgroup: None,
            https_ports: Vec::new(),
            policy: None,
            netns_cookie: None,
            verdict_timeout: Duration::from_secs(10),
            kernel_log: KernelLog::default(),
            early_reset: EarlyReset::default(),
            proxy_protocol: false,
        }
    }
}

/// The kernel's verdict on one connection (what to do with it is the [`Admission`] holding it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelVerdict {
    pub cookie: u64,
    pub reason: Reason,
    /// Low 32 bits of the policy generation the kernel decided with.
    pub generation: u32,
    /// Bytes of the first record (or of what arrived, for bytes that were not TLS).
    pub record_len: u32,
    /// The record came in the verdict's event (`take_first_record` takes it from there).
    pub delivered: bool,
}

/// What to do with an accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it: `take_first_record`, then TLS.
    Pass(KernelVerdict),
    /// Hand it to the backend untouched; `take_first_record` gives the bytes to forward.
    Passthrough(KernelVerdict),
    /// Reset it with `reject` without reading.
    Drop(KernelVerdict),
    /// The kernel could not decide (no free workspace): `take_first_record`, then decide in
    /// userspace.
    Deferred(KernelVerdict),
    /// sock_ops did not gate this socket (SOCKS or VERDICTS was full, or the connection was
    /// accepted by the listener before it was registered): decide in userspace.
    Ungated,
    /// No whole first record within the timeout.
    Timeout,
}

/// Per-CPU counters summed over CPUs, indexed by `ingress_common::counter`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCounters {
    pub values: [u64; counter::LEN as usize],
}

impl GateCounters {
    /// `(label, value)` for every counter, labels from `ingress_common::counter::as_str`.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        (0..counter::LEN)
            .zip(self.values.iter())
            .map(|(i, &v)| (counter::as_str(i), v))
    }

    pub fn get(&self, index: u32) -> u64 {
        self.values.get(index as usize).copied().unwrap_or(0)
    }
}

/// The kernel's decision on a raw buffer, from the probe program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    pub reason: Reason,
    /// `true` if the connection would be dropped.
    pub drop: bool,
    pub record_len: u32,
    /// The lowercased `server_name` when the kernel read a valid one.
    pub name: Option<String>,
}

/// What `sync_hosts` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub upserted: usize,
    pub removed: usize,
    /// Names that cannot be keys and so can never match (left out of HOSTS).
    pub rejected: Vec<String>,
}

/// A loaded, attached gate. Dropping it detaches the programs and removes the per-run pins.
pub struct Gate {
    shared: Arc<Shared>,
    events_task: tokio::task::JoinHandle<()>,
    rescan_task: Option<tokio::task::JoinHandle<()>>,
    /// Programs and their links: dropping this detaches everything (the rescan task only holds
    /// a weak reference).
    programs: Arc<Mutex<early::Programs>>,
    /// Held for the gate's life: one owner per pin directory. Field order is drop order, so it
    /// is released only after the pins are gone (see `Drop`).
    _pin_lock: sys::PinLock,
}

/// What the connection paths and the events task share.
struct Shared {
    hosts: Mutex<HostsState>,
    config: Mutex<Array<MapData, ingress_common::GateConfig>>,
    verdicts: Mutex<BpfHashMap<MapData, u64, VerdictRecord>>,
    next_message: Mutex<BpfHashMap<MapData, u64, u32>>,
    socks: Mutex<SockHash<MapData, u64>>,
    listeners: Mutex<SkStorage<MapData, u32>>,
    splice_socks: Mutex<SockHash<MapData, u64>>,
    splices: Mutex<BpfHashMap<MapData, u64, ingress_common::SpliceEntry>>,
    splice_state: Mutex<BpfHashMap<MapData, u64, ingress_common::SpliceState>>,
    counters: PerCpuArray<MapData, u64>,
    probe: Mutex<load::Probe>,
    waiters: events::Waiters,
    /// EVENTS: drained by the events task and by `screen` in the accept loop.
    events: Mutex<RingBuf<MapData>>,
    netns_cookie: u64,
    ports: Vec<u16>,
    /// `GateOptions::proxy_protocol`, for the CONFIG written before any snapshot.
    proxy_protocol: bool,
    timeout: Duration,
    pin_dir: PathBuf,
    /// Whether this kernel may splice at all (see `splice::kernel_fit`).
    splice_kernel: splice::KernelFit,
}

/// HOSTS and what userspace last wrote to it (read back from the map at load, so a restart that
/// reuses the pinned map diffs against what is really there).
struct HostsState {
    map: BpfHashMap<MapData, HostKey, HostValue>,
    current: std::collections::BTreeMap<HostKey, HostValue>,
    config: Option<ingress_common::GateConfig>,
    sources: aya::maps::LpmTrie<MapData, ingress_common::SourceData, ingress_common::SourceValue>,
    current_sources: std::collections::BTreeMap<policy::SourceKey, ingress_common::SourceValue>,
}

impl Gate {
    /// Loads the object, pins maps, writes the policy, attaches everything.
    pub fn load(options: GateOptions) -> Result<Gate> {
        load::load(options)
    }

    /// Moves HOSTS and CONFIG to `desired`: new and changed names first, then the config,
    /// then removals, so a name valid before and after is never missing.
    pub fn sync_hosts(&self, desired: &SniPolicy, generation: u64) -> Result<SyncReport> {
        self.shared.sync_hosts(desired, generation)
    }

    /// Records `generation` (and `desired`'s answers for unnamed connections) in CONFIG without
    /// touching HOSTS, which must already hold `desired`'s names.
    pub fn sync_config(&self, desired: &SniPolicy, generation: u64) -> Result<()> {
        self.shared.sync_config(desired, generation)
    }

    /// Summed per-CPU counters, for `/metrics`.
    pub fn counters(&self) -> Result<GateCounters> {
        let mut values = [0u64; counter::LEN as usize];
        for (index, slot) in (0..counter::LEN).zip(values.iter_mut()) {
            let per_cpu = self
                .shared
                .counters
                .get(&index, 0)
                .map_err(|source| GateError::Map {
                    name: "COUNTERS",
                    source,
                })?;
            *slot = per_cpu.iter().sum();
        }
        Ok(GateCounters { values })
    }

    /// Runs the kernel's ClientHello decision on `bytes` (the start of a connection) against
    /// the current policy, without a socket. For holding the kernel and userspace parsers to
    /// one corpus.
    pub fn probe(&self, bytes: &[u8]) -> Result<ProbeResult> {
        let programs = lock(&self.programs);
        self.shared
            .probe(load::probe_program(&programs.ebpf)?, bytes)
    }

    /// The directory the maps are pinned in.
    pub fn pin_dir(&self) -> &std::path::Path {
        &self.shared.pin_dir
    }

    /// The interfaces the early reset (TC ingress) is attached to now.
    pub fn early_reset_interfaces(&self) -> Vec<String> {
        lock(&self.programs).interfaces()
    }

    /// The interfaces where another TC program runs before the early reset (which may then
    /// never see a packet), as of the last rescan.
    pub fn early_reset_shadowed(&self) -> Vec<Shadowed> {
        lock(&self.programs).shadowed()
    }

    /// Marks `listener` (a socket that will listen, or listens, on a gated port) as the
    /// proxy's own: only its connections are gated. Best before `listen()`; a connection
    /// already queued is decided in userspace.
    pub fn register_listener(&self, listener: BorrowedFd<'_>) -> Result<()> {
        lock(&self.shared.listeners)
            .insert(&listener.as_raw_fd(), 1, 0)
            .map_err(|source| GateError::Map {
                name: "LISTENERS",
                source,
            })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.events_task.abort();
        if let Some(task) = &self.rescan_task {
            task.abort();
        }
        for name in [
            pins::VERDICTS,
            pins::SOCKS,
            pins::SPLICE_SOCKS,
            pins::SPLICES,
            pins::SPLICE_STATE,
            pins::PASSED_EARLY,
            pins::WORKSPACES,
            pins::WORKSPACE_BUSY,
        ] {
            let path = self.shared.pin_dir.join(name);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a pin");
            }
        }
    }
}

impl Shared {
    fn sync_hosts(&self, desired: &SniPolicy, generation: u64) -> Result<SyncReport> {
        let (entries, rejected) = policy::entries(desired);
        for name in &rejected {
            tracing::warn!(
                name,
                "host name cannot be a kernel key and can never match; left out"
            );
        }
        let config = policy::config(desired, generation, self.netns_cookie, &self.ports);
        let sources = policy::source_entries(&desired.sources);
        self.write_hosts(generation, &entries, &sources, config, &rejected)
    }

    fn sync_config(&self, desired: &SniPolicy, generation: u64) -> Result<()> {
        let mut hosts = lock(&self.hosts);
        let config = policy::config(desired, generation, self.netns_cookie, &self.ports);
        self.write_config(&mut hosts, config)
    }

    /// Writes CONFIG unless it already holds `config`.
    fn write_config(
        &self,
        hosts: &mut HostsState,
        config: ingress_common::GateConfig,
    ) -> Result<()> {
        if hosts.config != Some(config) {
            lock(&self.config)
                .set(0, config, 0)
                .map_err(|source| GateError::Map {
                    name: "CONFIG",
                    source,
                })?;
            hosts.config = Some(config);
        }
        Ok(())
    }

    fn write_hosts(
        &self,
        generation: u64,
        entries: &std::collections::BTreeMap<HostKey, HostValue>,
        sources: &std::collections::BTreeMap<policy::SourceKey, ingress_common::SourceValue>,
        config: ingress_common::GateConfig,
        rejected: &[String],
    ) -> Result<SyncReport> {
        let mut hosts = lock(&self.hosts);
        let steps = plan(&hosts.current, entries);
        let (source_upserts, source_removals) =
            policy::plan_sources(&hosts.current_sources, sources);
        let sources_err = |source| GateError::Map {
            name: "SOURCES",
            source,
        };
        // A policy's entries before any host points at its id, and removed only after none
        // does: a lookup always finds the policy's `/0` entry at least.
        for ((prefix, data), value) in &source_upserts {
            let key = aya::maps::lpm_trie::Key::new(*prefix, *data);
            hosts.sources.insert(&key, *value, 0).map_err(sources_err)?;
            hosts.current_sources.insert((*prefix, *data), *value);
        }
        let map_err = |source| GateError::Map {
            name: "HOSTS",
            source,
        };
        for (key, value) in &steps.upserts {
            hosts.map.insert(key, value, 0).map_err(map_err)?;
            hosts.current.insert(*key, *value);
        }
        self.write_config(&mut hosts, config)?;
        for key in &steps.removals {
            match hosts.map.remove(key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(source) => return Err(map_err(source)),
            }
            hosts.current.remove(key);
        }
        for (prefix, data) in &source_removals {
            let key = aya::maps::lpm_trie::Key::new(*prefix, *data);
            match hosts.sources.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(source) => return Err(sources_err(source)),
            }
            hosts.current_sources.remove(&(*prefix, *data));
        }
        if !steps.is_empty() {
            tracing::debug!(
                generation,
                upserted = steps.upserts.len(),
                removed = steps.removals.len(),
                "kernel host policy synced"
            );
        }
        Ok(SyncReport {
            upserted: steps.upserts.len(),
            removed: steps.removals.len(),
            rejected: rejected.to_vec(),
        })
    }

    /// At load without a policy: the pinned HOSTS stay as they are, and CONFIG keeps its policy
    /// but gates this process's namespace and ports.
    fn adopt_config(&self) -> Result<()> {
        let mut hosts = lock(&self.hosts);
        let mut config = lock(&self.config);
        let mut current = match config.get(&0, 0) {
            Ok(pinned) if pinned.port_count != 0 => pinned,
            _ => policy::config(
                &policy::admitting_unnamed(),
                0,
                self.netns_cookie,
                &self.ports,
            ),
        };
        let fresh = policy::config(
            &policy::admitting_unnamed(),
            0,
            self.netns_cookie,
            &self.ports,
        );
        current.netns_cookie = fresh.netns_cookie;
        current.ports = fresh.ports;
        current.port_count = fresh.port_count;
        current.proxy_protocol = u32::from(self.proxy_protocol);
        config.set(0, current, 0).map_err(|source| GateError::Map {
            name: "CONFIG",
            source,
        })?;
        hosts.config = Some(current);
        Ok(())
    }

    fn admission(&self, cookie: u64, record: &VerdictRecord) -> Option<Admission> {
        let (action, verdict) = verdict_of(cookie, record)?;
        Some(match action {
            action::DROP => Admission::Drop(verdict),
            action::PASSTHROUGH => Admission::Passthrough(verdict),
            action::DEFER => Admission::Deferred(verdict),
            _ => Admission::Pass(verdict),
        })
    }

    fn probe(&self, program: &aya::programs::Xdp, bytes: &[u8]) -> Result<ProbeResult> {
        let mut probe = lock(&self.probe);
        let event = probe.run(program, bytes)?;
        let reason =
            Reason::from_u32(event.reason).ok_or(GateError::Probe(std::io::Error::other(
                format!("the probe wrote no verdict (reason {})", event.reason),
            )))?;
        Ok(ProbeResult {
            reason,
            drop: event.action == action::DROP,
            record_len: event.record_len,
            name: (event.name_len > 0).then(|| String::from_utf8_lossy(event.name()).into_owned()),
        })
    }
}

fn verdict_of(cookie: u64, record: &VerdictRecord) -> Option<(u32, KernelVerdict)> {
    let reason = Reason::from_u32(record.reason)?;
    Some((
        record.action,
        KernelVerdict {
            cookie,
            reason,
            generation: record.generation,
            record_len: record.record_len,
            delivered: record.delivered != 0,
        },
    ))
}

fn record_of(event: &GateEvent) -> VerdictRecord {
    VerdictRecord {
        action: event.action,
        reason: event.reason,
        generation: event.generation,
        record_len: event.record_len,
        delivered: u32::from(event.payload_len != 0),
    }
}

/// Locks a mutex, recovering it if a holder panicked: every guarded value is a map handle or
/// plain data that stays valid mid-update.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
