//! Loading and attaching: the pin directory locked for this process, pins (reuse the policy
//! maps a previous run left if they still fit this object, replace the per-socket ones), then
//! the policy (or, with none given, the pinned one as it stands), then the stream programs on
//! SOCKS, and only then sock_ops and the early reset — so no socket is gated before its parser
//! and verdict exist and the config they read is written. Nothing is gated until userspace
//! registers its listener.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aya::maps::{
    Array, HashMap as BpfHashMap, LpmTrie, Map, MapData, MapInfo, PerCpuArray, RingBuf, SkStorage,
    SockHash,
};
use aya::programs::{CgroupAttachMode, ProgramError, SchedClassifier, SkSkb, SockOps, Xdp};
use aya::sys::SyscallError;
use aya::{Ebpf, EbpfLoader, TestRun, TestRunOptions};
use ingress_common::{GateEvent, MAX_PORTS};

use super::{
    EMBEDDED_OBJECT, EarlyReset, Gate, GateError, GateOptions, HostsState, KernelLog, Result,
    Shared, btf, early, events, lock, pins, sys,
};

/// Maps pinned by name: (map symbol, pin file, kept across restarts).
const PINNED: [(&str, &str, bool); 12] = [
    ("HOSTS", pins::HOSTS, true),
    ("SOURCES", pins::SOURCES, true),
    ("CONFIG", pins::CONFIG, true),
    ("COUNTERS", pins::COUNTERS, true),
    ("VERDICTS", pins::VERDICTS, false),
    ("SOCKS", pins::SOCKS, false),
    ("SPLICE_SOCKS", pins::SPLICE_SOCKS, false),
    ("SPLICES", pins::SPLICES, false),
    ("SPLICE_STATE", pins::SPLICE_STATE, false),
    ("PASSED_EARLY", pins::PASSED_EARLY, false),
    ("WORKSPACES", pins::WORKSPACES, false),
    ("BUSY", pins::WORKSPACE_BUSY, false),
];

/// The largest buffer handed to the probe: a full first record with room to spare. XDP test
/// runs take up to about 64 KiB in fragments.
const PROBE_MAX: usize = 32 * 1024;
/// Bytes before the data in a probe buffer (see `ProbeBuffer` in the eBPF crate).
const PROBE_PREFIX: usize = 16;

pub(super) fn load(options: GateOptions) -> Result<Gate> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| GateError::NoRuntime)?;
    if options.https_ports.is_empty() || options.https_ports.len() > MAX_PORTS {
        return Err(GateError::Ports(options.https_ports.len()));
    }
    let object = object_bytes(options.object.as_deref())?;
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(GateError::NoKernelBtf);
    }
    let netns_cookie = match options.netns_cookie {
        Some(cookie) => cookie,
        None => sys::current_netns_cookie().map_err(GateError::Netns)?,
    };
    let cgroup = match options.cgroup.clone() {
        Some(path) => path,
        None => sys::own_cgroup().map_err(GateError::Cgroup)?,
    };
    let cgroup_dir = std::fs::File::open(&cgroup).map_err(|source| GateError::OpenCgroup {
        path: cgroup.clone(),
        source,
    })?;
    sys::ensure_bpffs(&options.pin_dir).map_err(GateError::PinDir)?;
    // Before anything under it is touched: another process's pins are not ours to replace.
    let pin_lock = match sys::lock_pin_dir(&options.pin_dir) {
        Ok(Ok(lock)) => lock,
        Ok(Err(holder)) => {
            return Err(GateError::PinDirInUse {
                dir: options.pin_dir.clone(),
                holder,
            });
        }
        Err(e) => {
            return Err(GateError::PinDir(format!(
                "locking {}: {e}",
                options.pin_dir.display()
            )));
        }
    };
    prepare_pins(&object, &options.pin_dir)?;

    let mut loader = EbpfLoader::new();
    let pin_paths: Vec<(&str, PathBuf)> = PINNED
        .iter()
        .map(|(map, file, _)| (*map, options.pin_dir.join(file)))
        .collect();
    for (map, path) in &pin_paths {
        loader.map_pin_path(map, path.as_path());
    }
    let log_level = kernel_log_level(options.kernel_log);
    loader.override_global("AYA_LOG_LEVEL", &log_level, true);
    let offsets = request_sock_offsets();
    loader.override_global("TCP_REQ_RCV_ISN", &offsets[0], true);
    loader.override_global("TCP_REQ_SNT_ISN", &offsets[1], true);
    let mut ebpf = loader
        .load(&object)
        .map_err(|e| GateError::Load(Box::new(e)))?;

    let hosts: BpfHashMap<MapData, _, _> = take(&mut ebpf, "HOSTS")?;
    let current = hosts
        .iter()
        .filter_map(|entry| entry.ok())
        .collect::<BTreeMap<_, _>>();
    let sources: LpmTrie<MapData, ingress_common::SourceData, ingress_common::SourceValue> =
        take(&mut ebpf, "SOURCES")?;
    // What a previous run left (kept with HOSTS, whose ids point into it), diffed against.
    let current_sources = sources
        .iter()
        .filter_map(|entry| entry.ok())
        .map(|(key, value)| ((key.prefix_len(), key.data()), value))
        .collect::<BTreeMap<_, _>>();
    let socks: SockHash<MapData, u64> = take(&mut ebpf, "SOCKS")?;
    let socks_fd = socks.fd().try_clone().map_err(GateError::Socket)?;
    let splice_socks: SockHash<MapData, u64> = take(&mut ebpf, "SPLICE_SOCKS")?;
    let splice_socks_fd = splice_socks.fd().try_clone().map_err(GateError::Socket)?;
    let events: RingBuf<MapData> = take(&mut ebpf, "EVENTS")?;
    let probe_map: Array<MapData, GateEvent> = take(&mut ebpf, "PROBE")?;
    let logger = aya_log::EbpfLogger::init_with_logger(&mut ebpf, events::LogBridge)
        .inspect_err(|e| tracing::warn!(error = %e, "kernel log records will not be read"))
        .ok();

    // Loaded, never attached: `Probe::run` test-runs it from `early::Programs`, which keeps it.
    let probe: &mut Xdp = program(&mut ebpf, PROBE_PROGRAM)?;
    load_program(PROBE_PROGRAM, || probe.load())?;

    let shared = Arc::new(Shared {
        hosts: Mutex::new(HostsState {
            map: hosts,
            current,
            config: None,
            sources,
            current_sources,
        }),
        config: Mutex::new(take(&mut ebpf, "CONFIG")?),
        verdicts: Mutex::new(take(&mut ebpf, "VERDICTS")?),
        next_message: Mutex::new(take(&mut ebpf, "NEXT_MESSAGE")?),
        socks: Mutex::new(socks),
        listeners: Mutex::new(take::<SkStorage<MapData, u32>>(&mut ebpf, "LISTENERS")?),
        splice_socks: Mutex::new(splice_socks),
        splices: Mutex::new(take(&mut ebpf, "SPLICES")?),
        splice_state: Mutex::new(take(&mut ebpf, "SPLICE_STATE")?),
        counters: take::<PerCpuArray<MapData, u64>>(&mut ebpf, "COUNTERS")?,
        probe: Mutex::new(Probe { map: probe_map }),
        waiters: events::Waiters::default(),
        events: Mutex::new(events),
        netns_cookie,
        ports: options.https_ports.clone(),
        proxy_protocol: options.proxy_protocol,
        timeout: options.verdict_timeout,
        pin_dir: options.pin_dir.clone(),
        splice_kernel: super::splice::kernel_fit(),
    });
    if let super::splice::KernelFit::Duplicates(version) = shared.splice_kernel {
        tracing::warn!(
            kernel = %version,
            "this kernel's sockmap can send a partly sent message twice (fixed by 'bpf, sockmap: fix duplicated data transmission'); TLS passthrough connections are copied in userspace instead of spliced"
        );
    }
    match &options.policy {
        Some(policy) => {
            shared.sync_hosts(policy, 0)?;
        }
        None => shared.adopt_config()?,
    }

    for name in ["gate_parser", "gate_verdict"] {
        let prog: &mut SkSkb = program(&mut ebpf, name)?;
        load_program(name, || prog.load())?;
        prog.attach(&socks_fd)
            .map_err(|source| GateError::Program { name, source })?;
    }
    // No parser on SPLICE_SOCKS: the verdict sees whole skbs straight from the receive queue,
    // the cheapest path the kernel has for a byte stream it only forwards.
    let splice: &mut SkSkb = program(&mut ebpf, "splice_verdict")?;
    load_program("splice_verdict", || splice.load())?;
    splice
        .attach(&splice_socks_fd)
        .map_err(|source| GateError::Program {
            name: "splice_verdict",
            source,
        })?;
    let sock_ops: &mut SockOps = program(&mut ebpf, "gate_sock_ops")?;
    load_program("gate_sock_ops", || sock_ops.load())?;
    // A cgroup link (what aya creates on this kernel) always coexists with other programs on
    // the cgroup, and the kernel refuses attach flags on link creation: hence Single.
    sock_ops
        .attach(cgroup_dir, CgroupAttachMode::Single)
        .map_err(|source| GateError::Program {
            name: "gate_sock_ops",
            source,
        })?;

    // Last: it judges with the policy already written, and a connection it leaves alone goes
    // through everything attached above.
    let early_prog: &mut SchedClassifier = program(&mut ebpf, early::PROGRAM)?;
    load_program(early::PROGRAM, || early_prog.load())?;
    let mut programs = early::Programs::new(ebpf);
    let outcome = programs.sync(&options.early_reset)?;
    if options.early_reset != EarlyReset::All
        && (!outcome.unusable.is_empty() || !outcome.failed.is_empty())
    {
        let failed = outcome
            .failed
            .iter()
            .map(|(name, why)| format!("{name}: {why}"));
        let unusable = outcome
            .unusable
            .iter()
            .map(|name| format!("{name}: absent, or neither Ethernet nor loopback"));
        return Err(GateError::EarlyReset(
            failed.chain(unusable).collect::<Vec<_>>().join("; "),
        ));
    }
    early::report(&outcome);
    let programs = Arc::new(Mutex::new(programs));
    let rescan_task = (options.early_reset != EarlyReset::Off).then(|| {
        runtime.spawn(early::rescan(
            Arc::downgrade(&programs),
            options.early_reset.clone(),
        ))
    });

    let events_task = runtime.spawn(events::run(shared.clone(), logger));
    tracing::info!(
        pin_dir = %options.pin_dir.display(),
        cgroup = %cgroup.display(),
        ports = ?options.https_ports,
        netns_cookie,
        hosts = lock(&shared.hosts).current.len(),
        kernel_log_level = log_level,
        early_reset = ?lock(&programs).interfaces(),
        "kernel SNI gate attached"
    );
    Ok(Gate {
        shared,
        events_task,
        rescan_task,
        programs,
        _pin_lock: pin_lock,
    })
}

/// Where `tcp_request_sock.rcv_isn` and `snt_isn` are on this kernel, for the early reset's
/// first-segment check; `u32::MAX` (the early reset judges nothing) if its BTF does not say.
fn request_sock_offsets() -> [u32; 2] {
    let found = btf::Btf::from_file(Path::new(btf::VMLINUX)).and_then(|btf| {
        Ok([
            btf.member_offset("tcp_request_sock", "rcv_isn", 4)?,
            btf.member_offset("tcp_request_sock", "snt_isn", 4)?,
        ])
    });
    match found {
        Ok(offsets) => offsets,
        Err(e) => {
            tracing::warn!(error = %e, "cannot find the request sock's sequence numbers in the kernel's BTF; the early reset judges nothing and every connection is judged after accept");
            [u32::MAX; 2]
        }
    }
}

fn object_bytes(path: Option<&Path>) -> Result<Vec<u8>> {
    match path {
        Some(path) => std::fs::read(path).map_err(|source| GateError::ReadObject {
            path: path.into(),
            source,
        }),
        None => EMBEDDED_OBJECT
            .map(<[u8]>::to_vec)
            .ok_or(GateError::NotEmbedded),
    }
}

/// Removes pins that must not be reused: the per-socket maps always, the policy maps when a
/// previous build left them with another shape (reusing those would corrupt lookups silently).
fn prepare_pins(object: &[u8], dir: &Path) -> Result<()> {
    let parsed = aya_obj::Object::parse(object).map_err(|e| GateError::Load(Box::new(e.into())))?;
    for (map, file, keep) in PINNED {
        let path = dir.join(file);
        if !path.exists() {
            continue;
        }
        let def = parsed.maps.get(map).ok_or(GateError::Missing(map))?;
        let stale = if keep {
            incompatible(&path, def)
        } else {
            Some("it belonged to the previous run".into())
        };
        if let Some(reason) = stale {
            tracing::info!(path = %path.display(), reason, "replacing a pinned map");
            std::fs::remove_file(&path).map_err(|e| GateError::Pin {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// Why the pinned map at `path` cannot serve as `def`, or `None` if it can.
fn incompatible(path: &Path, def: &aya_obj::Map) -> Option<String> {
    let info = match MapInfo::from_pin(path) {
        Ok(info) => info,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    let have = (
        info.key_size(),
        info.value_size(),
        info.max_entries(),
        info.map_flags(),
    );
    let want = (
        def.key_size(),
        def.value_size(),
        def.max_entries(),
        def.map_flags(),
    );
    (have != want)
        .then(|| format!("shape (key, value, entries, flags) {have:?}, this build needs {want:?}"))
}

/// Patched into the object: the verifier drops every disabled log call, so logging costs
/// nothing unless it is on.
fn kernel_log_level(setting: KernelLog) -> u8 {
    let debug = match setting {
        KernelLog::FromTracing => {
            tracing::enabled!(target: "ingress::gate::kernel", tracing::Level::DEBUG)
        }
        KernelLog::Off => false,
        KernelLog::Debug => true,
    };
    if debug {
        aya_log::Level::Debug as u8
    } else {
        0
    }
}

fn take<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M>
where
    M: TryFrom<Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(GateError::Missing(name))?;
    M::try_from(map).map_err(|source| GateError::Map { name, source })
}

fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or(GateError::Missing(name))?;
    prog.try_into()
        .map_err(|source| GateError::Program { name, source })
}

/// How many times a program load is tried when the verifier gives up with EAGAIN, as libbpf does.
const LOAD_ATTEMPTS: u32 = 5;

/// Runs one `BPF_PROG_LOAD`, again if it failed with EAGAIN: the verifier abandons its check
/// when a signal is pending on the loading thread (one child process exiting under tokio's
/// SIGCHLD handler is enough), which says nothing about the program.
fn load_program(
    name: &'static str,
    mut load: impl FnMut() -> std::result::Result<(), ProgramError>,
) -> Result<()> {
    let mut attempt = 1;
    loop {
        match load() {
            Err(ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempt < LOAD_ATTEMPTS =>
            {
                tracing::debug!(
                    program = name,
                    attempt,
                    "the verifier was interrupted; loading again"
                );
                attempt += 1;
            }
            other => return other.map_err(|source| GateError::Program { name, source }),
        }
    }
}

/// The XDP program that runs the verdict's decision on a buffer (`BPF_PROG_TEST_RUN`).
pub(super) const PROBE_PROGRAM: &str = "gate_probe";

/// The loaded probe program, from the object `early::Programs` keeps.
pub(super) fn probe_program(ebpf: &Ebpf) -> Result<&Xdp> {
    let prog = ebpf
        .program(PROBE_PROGRAM)
        .ok_or(GateError::Missing(PROBE_PROGRAM))?;
    prog.try_into().map_err(|source| GateError::Program {
        name: PROBE_PROGRAM,
        source,
    })
}

/// The probe program's result map; one run at a time.
pub(super) struct Probe {
    map: Array<MapData, GateEvent>,
}

impl Probe {
    pub(super) fn run(&mut self, program: &Xdp, bytes: &[u8]) -> Result<GateEvent> {
        if bytes.len() > PROBE_MAX {
            return Err(GateError::ProbeTooLarge(bytes.len()));
        }
        let len = u32::try_from(bytes.len()).map_err(|_| GateError::ProbeTooLarge(bytes.len()))?;
        let mut buffer = Vec::with_capacity(PROBE_PREFIX + bytes.len());
        buffer.extend_from_slice(&len.to_le_bytes());
        buffer.resize(PROBE_PREFIX, 0);
        buffer.extend_from_slice(bytes);
        // SAFETY: GateEvent is plain integers; all zero is a valid value (reason 0 = none).
        let empty: GateEvent = unsafe { std::mem::zeroed() };
        let map_err = |source| GateError::Map {
            name: "PROBE",
            source,
        };
        self.map.set(0, empty, 0).map_err(map_err)?;
        let options = TestRunOptions {
            data_in: Some(&buffer),
            ..TestRunOptions::default()
        };
        program.test_run(options).map_err(|source| match source {
            ProgramError::SyscallError(SyscallError { io_error, .. }) => GateError::Probe(io_error),
            source => GateError::Program {
                name: PROBE_PROGRAM,
                source,
            },
        })?;
        self.map.get(&0, 0).map_err(map_err)
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn failure(errno: i32) -> ProgramError {
        ProgramError::LoadError {
            io_error: io::Error::from_raw_os_error(errno),
            verifier_log: aya_obj::VerifierLog::new(String::new()),
        }
    }

    /// Runs `load_program` over a script of results; returns its outcome and the calls made.
    fn run(script: &[Option<i32>]) -> (Result<()>, usize) {
        let mut calls = 0;
        let outcome = load_program("test", || {
            let step = script.get(calls).copied().flatten();
            calls += 1;
            step.map_or(Ok(()), |errno| Err(failure(errno)))
        });
        (outcome, calls)
    }

    #[test]
    fn an_interrupted_verifier_is_tried_again_and_nothing_else_is() {
        let eagain = Some(libc::EAGAIN);
        let cases: [(&[Option<i32>], bool, usize); 5] = [
            (&[None], true, 1),
            (&[eagain, None], true, 2),
            (&[eagain, eagain, eagain, eagain, None], true, 5),
            (&[eagain; 6], false, LOAD_ATTEMPTS as usize),
            (&[Some(libc::EACCES), None], false, 1),
        ];
        for (script, loads, calls) in cases {
            let (outcome, made) = run(script);
            assert_eq!(outcome.is_ok(), loads, "{script:?}");
            assert_eq!(made, calls, "{script:?}");
        }
    }
}
