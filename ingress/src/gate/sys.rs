//! The operating-system edges the gate needs that aya does not cover: bpffs, cgroup v2
//! discovery, socket and network-namespace cookies, socket queues, and network interfaces.
//!
//! Where a maintained crate in the tree has the call, it is used, not hand-rolled:
//!
//! ```text
//!   SO_COOKIE            socket2::SockRef::cookie           (socket_cookie)
//!   BPF_PROG_TEST_RUN    aya's TestRun on the Xdp program   (gate/load.rs, Probe::run)
//!   epoll                rustix::event::epoll               (gate/splice.rs, Poller)
//! ```
//!
//! What stays on libc here has no equivalent in socket2 0.6, rustix 1 or aya 0.14:
//! - `SO_NETNS_COOKIE` (neither crate has the option);
//! - `TCP_INFO`'s byte counts and `SIOCOUTQ` (socket2 has neither; rustix has no `TCP_INFO`);
//! - `if_nameindex` and `SIOCGIFHWADDR` (the link type of every interface);
//! - the /proc/locks lookup of who holds the pin directory's `flock`;
//! - `statfs`'s bpffs magic and `mount -t bpf`, `flock`, one-byte `MSG_PEEK | MSG_DONTWAIT`
//!   `recv`, and `FIONREAD` (signed here: a negative count is a kernel fault worth seeing,
//!   where rustix's `ioctl_fionread` returns a `u64`). rustix has most of this last group;
//!   moving to it would add the `fs`, `mount` and `net` features for a handful of calls that
//!   each already carry their SAFETY argument.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs is conventionally mounted; the only place the gate mounts one itself.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Makes sure `dir` exists on a bpf filesystem. Mounts one at /sys/fs/bpf when `dir` is under it,
/// nothing is mounted there yet, and the process is root.
pub fn ensure_bpffs(dir: &Path) -> Result<(), String> {
    let existing = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    if !is_bpffs(existing)? {
        let root = Path::new(BPFFS_ROOT);
        if !dir.starts_with(root) {
            return Err(format!(
                "{} is not on a bpf filesystem; mount one (mount -t bpf bpf <dir>) or pin under {BPFFS_ROOT}",
                dir.display()
            ));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(format!(
                "{BPFFS_ROOT} is not a bpf filesystem and only root can mount one there"
            ));
        }
        mount_bpffs(root)?;
        if !is_bpffs(dir.ancestors().find(|a| a.exists()).unwrap_or(root))? {
            return Err(format!(
                "{} is still not on a bpf filesystem after mounting {BPFFS_ROOT}",
                dir.display()
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// An exclusive `flock` on the pin directory, held while the gate is loaded. The kernel drops
/// it when the process exits, however it exits, so a crashed owner never blocks the next one.
pub struct PinLock {
    _dir: std::fs::File,
}

/// Takes the pin directory for this process: `Err(Some(pid))` or `Err(None)` if another
/// process holds it (its pid, when /proc/locks names it).
pub fn lock_pin_dir(dir: &Path) -> io::Result<Result<PinLock, Option<u32>>> {
    let file = std::fs::File::open(dir)?;
    // SAFETY: a valid descriptor; LOCK_NB never blocks.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Ok(PinLock { _dir: file }));
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(error);
    }
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    let holder = std::fs::read_to_string("/proc/locks")
        .ok()
        .and_then(|locks| lock_holder(&locks, meta.dev(), meta.ino()));
    Ok(Err(holder))
}

/// The pid holding a FLOCK on the inode `(dev, ino)` in a /proc/locks table.
fn lock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // "1: FLOCK  ADVISORY  WRITE 4242 00:27:37708 0 EOF": device as major:minor in hex.
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let wanted = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flock = fields.get(1) == Some(&"FLOCK");
        (flock && fields.get(5) == Some(&wanted.as_str()))
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

fn is_bpffs(path: &Path) -> Result<bool, String> {
    let c = c_path(path)?;
    // SAFETY: an all-zero statfs is a valid out-parameter for statfs(2).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-parameter.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statfs {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    #[allow(
        clippy::useless_conversion,
        reason = "f_type is i64 on x86_64 but narrower on other targets"
    )]
    let f_type = i64::from(st.f_type);
    Ok(f_type == BPF_FS_MAGIC)
}

fn mount_bpffs(at: &Path) -> Result<(), String> {
    std::fs::create_dir_all(at).map_err(|e| format!("creating {}: {e}", at.display()))?;
    let target = c_path(at)?;
    let fstype = c"bpf";
    // SAFETY: all pointers are valid NUL-terminated strings; no mount data.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mount -t bpf bpf {}: {}",
            at.display(),
            io::Error::last_os_error()
        ));
    }
    tracing::info!(at = %at.display(), "mounted a bpf filesystem");
    Ok(())
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", path.display()))
}

/// The cgroup v2 directory of this process: the v2 mount (found in mountinfo, not assumed)
/// joined with the path in /proc/self/cgroup, or the mount root if that path is not visible.
pub fn own_cgroup() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup2 filesystem is mounted")?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let own = unified_path(&cgroup)
        .map(|p| mount.join(p.trim_start_matches('/')))
        .filter(|p| p.is_dir())
        .unwrap_or(mount);
    Ok(own)
}

/// The mount point of the first cgroup2 filesystem in a mountinfo table.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "<id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype> ..."
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The cgroup v2 path ("0::<path>") from a /proc/<pid>/cgroup table.
fn unified_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|line| line.strip_prefix("0::"))
}

/// `SO_COOKIE`: the key the kernel filed the socket under in SOCKS and VERDICTS.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    socket2::SockRef::from(&fd).cookie()
}

/// The cookie of the network namespace the calling thread is in (`SO_NETNS_COOKIE`), via a
/// throwaway socket.
pub fn current_netns_cookie() -> io::Result<u64> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let mut value = 0u64;
    let mut len: libc::socklen_t = 8; // size_of::<u64>()
    // SAFETY: `value` and `len` are valid out-parameters of the size given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// One non-blocking `MSG_PEEK` of a byte. A ClientHello that arrived before the socket joined
/// SOCKS can sit in the receive queue until something reads; this makes the stream parser run.
pub fn peek_kick(fd: BorrowedFd<'_>) {
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer for a one-byte peek; the result only matters as a side effect.
    let _ = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
}

/// One non-blocking `recv` into `buf`: the kernel's answer now, not a cached readiness.
pub fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the duration of the call.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Bytes in the socket's receive queue that no read has taken yet (`FIONREAD`: the next byte
/// TCP expects minus the read position). Negative when the read position is past the data,
/// which only a kernel accounting fault produces.
pub fn unread(fd: BorrowedFd<'_>) -> io::Result<i64> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &raw mut queued) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i64::from(queued))
}

/// A TCP socket's byte counts, in sequence space: what the splice lifecycle compares to know
/// that every byte one socket received has left through the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpCounts {
    /// Bytes the peer sent that arrived in order (`tcpi_bytes_received`); a received FIN counts
    /// as one.
    pub received: u64,
    /// Bytes written into the socket so far, sent or still queued: acknowledged
    /// (`tcpi_bytes_acked`) plus the send queue (`SIOCOUTQ`).
    pub written: u64,
    /// The state says the peer's FIN arrived (CLOSE_WAIT, LAST_ACK, CLOSING, TIME_WAIT).
    pub fin_received: bool,
}

pub fn tcp_counts(fd: BorrowedFd<'_>) -> io::Result<TcpCounts> {
    // SAFETY: an all-zero tcp_info is a valid out-parameter.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `info` and `len` are valid out-parameters of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ's value) writes one int.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &raw mut queued) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpCounts {
        received: info.tcpi_bytes_received,
        written: info
            .tcpi_bytes_acked
            .saturating_add(u64::try_from(queued).unwrap_or(0)),
        // include/net/tcp_states.h
        fin_received: matches!(info.tcpi_state, 6 | 8 | 9 | 11),
    })
}

/// A network interface of the calling thread's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub index: u32,
    pub name: String,
    /// `ARPHRD_*`: how frames on it start.
    pub link_type: u16,
}

pub const ARPHRD_ETHER: u16 = 1;
pub const ARPHRD_LOOPBACK: u16 = 772;

/// The interfaces of the calling thread's network namespace (netlink, not /sys, which shows the
/// namespace it was mounted in).
pub fn interfaces() -> io::Result<Vec<Interface>> {
    // SAFETY: no preconditions; the list is freed below.
    let list = unsafe { libc::if_nameindex() };
    if list.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut entry = list;
    // SAFETY: the list ends with an entry whose index is 0 and name null.
    unsafe {
        while (*entry).if_index != 0 && !(*entry).if_name.is_null() {
            let name = std::ffi::CStr::from_ptr((*entry).if_name)
                .to_string_lossy()
                .into_owned();
            found.push(((*entry).if_index, name));
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
    }
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    Ok(found
        .into_iter()
        .map(|(index, name)| {
            let link_type = link_type(socket.as_raw_fd(), &name).unwrap_or(0);
            Interface {
                index,
                name,
                link_type,
            }
        })
        .collect())
}

/// `SIOCGIFHWADDR`: the hardware address family is the link type.
fn link_type(socket: RawFd, name: &str) -> io::Result<u16> {
    // SAFETY: an all-zero ifreq is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (to, from) in req.ifr_name.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    // SAFETY: a valid socket and a NUL-terminated name in a full ifreq.
    if unsafe { libc::ioctl(socket, libc::SIOCGIFHWADDR, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the hardware-address member.
    Ok(unsafe { req.ifr_ifru.ifru_hwaddr.sa_family })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_wherever_it_is() {
        let cases = [
            (
                "25 20 0:22 / /sys/fs/cgroup/unified rw,relatime shared:8 - cgroup2 cgroup2 rw\n",
                Some("/sys/fs/cgroup/unified"),
            ),
            (
                "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
                Some("/sys/fs/cgroup"),
            ),
            (
                "24 20 0:21 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n31 1 0:27 / /my\\040cg rw - cgroup2 none rw\n",
                Some("/my cg"),
            ),
            (
                "24 20 0:21 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
                None,
            ),
        ];
        for (table, want) in cases {
            assert_eq!(cgroup2_mount(table), want.map(PathBuf::from), "{table}");
        }
    }

    #[test]
    fn finds_who_holds_a_lock() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:27:37708 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 99 00:27:37708 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 7 fe:00:37708 0 EOF\n";
        let dev = libc::makedev(0, 0x27);
        assert_eq!(lock_holder(locks, dev, 37708), Some(4242));
        assert_eq!(lock_holder(locks, libc::makedev(0xfe, 0), 37708), Some(7));
        assert_eq!(lock_holder(locks, dev, 1), None);
    }

    #[test]
    fn a_second_lock_on_a_pin_dir_is_refused_and_freed_with_the_first() {
        let dir = std::env::temp_dir().join(format!("ingress-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = lock_pin_dir(&dir).unwrap().ok().unwrap();
        // flock locks belong to the open file: a second open in the same process conflicts.
        assert_eq!(
            lock_pin_dir(&dir).unwrap().err(),
            Some(Some(std::process::id()))
        );
        drop(first);
        assert!(lock_pin_dir(&dir).unwrap().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_the_unified_line_of_proc_cgroup() {
        let cases = [
            ("9:name=systemd:/\n4:memory:/x\n0::/\n", Some("/")),
            (
                "0::/kubepods/burstable/pod1/abc\n",
                Some("/kubepods/burstable/pod1/abc"),
            ),
            ("4:memory:/x\n", None),
        ];
        for (table, want) in cases {
            assert_eq!(unified_path(table), want, "{table}");
        }
    }
}
