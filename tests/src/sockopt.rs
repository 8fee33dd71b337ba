//! Socket options the tests set to make a peer behave as a particular client or server would.

use std::os::fd::AsRawFd;

/// SO_LINGER {on, 0}: the close that follows sends an RST instead of a FIN.
pub fn linger_zero(socket: &impl AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).expect("small");
    // SAFETY: a valid socket and a linger struct of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            len,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// TCP_DEFER_ACCEPT on a listener (as nginx's `listen … deferred`): its connections wait in the
/// SYN queue for their first data.
pub fn defer_accept(listener: &impl AsRawFd) {
    let seconds: libc::c_int = 5;
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).expect("small");
    // SAFETY: a valid socket and an int option of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const seconds).cast(),
            len,
        )
    };
    assert_eq!(
        rc,
        0,
        "TCP_DEFER_ACCEPT: {}",
        std::io::Error::last_os_error()
    );
}
