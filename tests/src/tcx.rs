//! A stand-in for a CNI's TC program: two instructions that return `TC_ACT_OK` (the verdict
//! Cilium's programs give a packet they let through), attached to an interface's TCX ingress
//! hook before every other program there. `tcx_run` stops at the first verdict other than
//! "next", so whatever is attached after it never sees a packet.
//!
//! Loaded and attached with raw `bpf(2)` calls: no object file, no loader, nothing pinned.
//! Dropping the [`StandIn`] closes the link, which detaches the program.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::netns::NetNs;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
/// `BPF_F_BEFORE` with no relative program: before every program on the hook.
const BPF_F_BEFORE: u32 = 1 << 3;

/// A loaded, attached stand-in. Dropped: detached and unloaded.
pub struct StandIn {
    _link: OwnedFd,
    _prog: OwnedFd,
}

impl StandIn {
    /// Loads the program and attaches it first on `ifname`'s TCX ingress hook in `ns`.
    pub fn attach_first(ns: &NetNs, ifname: &str) -> io::Result<StandIn> {
        let name = std::ffi::CString::new(ifname).map_err(io::Error::other)?;
        ns.run(move || -> io::Result<StandIn> {
            // SAFETY: a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            let prog = load()?;
            let link = link_create(&prog, ifindex)?;
            Ok(StandIn {
                _link: link,
                _prog: prog,
            })
        })?
    }
}

/// `r0 = 0 (TC_ACT_OK); exit`.
fn load() -> io::Result<OwnedFd> {
    // struct bpf_insn: u8 code, u8 dst:4 src:4, s16 off, s32 imm.
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    let license = c"GPL";
    #[repr(C)]
    #[derive(Default)]
    struct LoadAttr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
    }
    let mut attr = LoadAttr {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..LoadAttr::default()
    };
    attr.prog_name[..7].copy_from_slice(b"standin");
    bpf(
        BPF_PROG_LOAD,
        &raw mut attr,
        std::mem::size_of::<LoadAttr>(),
    )
}

fn link_create(prog: &OwnedFd, ifindex: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Default)]
    struct LinkAttr {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
        /// `tcx.relative_fd`: 0 with BPF_F_BEFORE means "first".
        relative_fd: u32,
        _pad: u32,
        expected_revision: u64,
    }
    let mut attr = LinkAttr {
        prog_fd: u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?,
        target_ifindex: ifindex,
        attach_type: BPF_TCX_INGRESS,
        flags: BPF_F_BEFORE,
        ..LinkAttr::default()
    };
    bpf(
        BPF_LINK_CREATE,
        &raw mut attr,
        std::mem::size_of::<LinkAttr>(),
    )
}

/// `bpf(cmd, attr)` for a command that returns a new descriptor.
fn bpf<T>(cmd: libc::c_long, attr: *mut T, size: usize) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid bpf_attr prefix of `size` bytes for `cmd`; the pointers in it
    // outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.cast::<libc::c_void>(), size) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
