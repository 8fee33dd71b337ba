//! wrk runs and their parsed results.

use std::time::Duration;

use anyhow::{Context, Result};

use super::procs;

#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Responses received.
    pub requests: u64,
    /// Of them, ones other than 2xx and 3xx.
    pub non_2xx: u64,
    /// Requests that got no response: connect, read, write errors and timeouts.
    pub socket_errors: u64,
    /// Of them, the ones wrk gave up waiting for (its 2 s timeout).
    pub timeouts: u64,
}

impl Load {
    /// Every request answered 2xx or 3xx, except at most 1% that timed out: on a loaded machine
    /// a slow peer (nginx checking bcrypt) makes wrk give up on a request that nothing refused,
    /// while a refusal, a reset or a failed connect is never excused.
    pub fn all_answered(&self) -> bool {
        self.non_2xx == 0
            && self.socket_errors == self.timeouts
            && self.timeouts.saturating_mul(100) <= self.requests
    }

    /// Of the requests attempted, the share that got a 2xx or 3xx answer.
    pub fn success_rate(&self) -> f64 {
        let attempted = self.requests + self.socket_errors;
        if attempted == 0 {
            return 0.0;
        }
        self.requests.saturating_sub(self.non_2xx) as f64 / attempted as f64
    }
}

/// Runs wrk (one thread, pinned next to the upstream) against `url` with a Host header.
pub fn run(
    url: &str,
    host: &str,
    duration: Duration,
    connections: u32,
    extra_header: Option<&str>,
) -> Result<Load> {
    let mut cmd = procs::pinned(1, "wrk");
    cmd.args([
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{}s", duration.as_secs().max(1)),
        "--latency",
    ])
    .args(["-H", &format!("Host: {host}")]);
    if let Some(h) = extra_header {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).with_context(|| {
        format!(
            "unexpected wrk output:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn parse(text: &str) -> Option<Load> {
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())?;
    let percentile = |p: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(p).map(str::trim))
            .and_then(duration_ms)
    };
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(0);
    let non_2xx: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // `Socket errors: connect 0, read 3, write 0, timeout 12`
    let socket_errors: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .map(|v| {
            v.split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    let timeouts: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .and_then(|v| {
            v.split(',')
                .find_map(|part| part.trim().strip_prefix("timeout"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0);
    Some(Load {
        requests_per_sec: rps,
        p50_ms: percentile("50%")?,
        p99_ms: percentile("99%")?,
        requests,
        non_2xx,
        socket_errors,
        timeouts,
    })
}

/// wrk prints durations as `628.00us`, `1.33ms` or `2.10s`.
fn duration_ms(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(v) = text.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = text.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1000.0)
    } else {
        return None;
    };
    number.trim().parse::<f64>().ok().map(|n| n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_output() {
        let text = "Running 5s test @ http://127.0.0.1:19080/\n  Latency Distribution\n     50%  628.00us\n     75%    1.00ms\n     90%    1.10ms\n     99%    1.33ms\n  228826 requests in 5.00s, 40.15MB read\nRequests/sec:  45764.07\nTransfer/sec:      8.03MB\n";
        let load = parse(text).unwrap();
        assert_eq!(
            (load.requests, load.non_2xx, load.socket_errors),
            (228826, 0, 0)
        );
        assert_eq!(load.requests_per_sec, 45764.07);
        assert!((load.p50_ms - 0.628).abs() < 1e-9);
        assert!((load.p99_ms - 1.33).abs() < 1e-9);
        assert_eq!(duration_ms("2.5s"), Some(2500.0));
        let failing = format!(
            "{text}  Socket errors: connect 0, read 3, write 0, timeout 12\n  Non-2xx or 3xx responses: 5\n"
        );
        let load = parse(&failing).unwrap();
        assert_eq!((load.non_2xx, load.socket_errors), (5, 15));
        assert!((load.success_rate() - (228826.0 - 5.0) / (228826.0 + 15.0)).abs() < 1e-3);
        assert_eq!(load.timeouts, 12);
        assert!(!load.all_answered());
        // A few timeouts alone are a slow peer, not a refusal; a reset or too many are not.
        let slow = format!("{text}  Socket errors: connect 0, read 0, write 0, timeout 2\n");
        assert!(parse(&slow).unwrap().all_answered());
        let reset = format!("{text}  Socket errors: connect 0, read 1, write 0, timeout 2\n");
        assert!(!parse(&reset).unwrap().all_answered());
        let stalled = format!("{text}  Socket errors: connect 0, read 0, write 0, timeout 9999\n");
        assert!(!parse(&stalled).unwrap().all_answered());
    }
}
