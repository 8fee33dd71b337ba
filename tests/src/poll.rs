//! Waiting for a live change: a manifests edit or an API write reaches traffic after a
//! debounce and a snapshot build, so a test polls for it (blocking: the tests using it have no
//! runtime).

use std::time::{Duration, Instant};

/// Polls `probe` every 50 ms until it returns `want`; panics with the last value after 10 s.
pub fn eventually<T: PartialEq + std::fmt::Debug>(
    what: &str,
    want: T,
    mut probe: impl FnMut() -> T,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = probe();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {got:?}, wanted {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
