//! `session-cookie-conditional-samesite-none`: which browsers must not be sent
//! `SameSite=None`. Some treat it as `Strict` (Safari on iOS 12 and macOS 10.14, from a WebKit
//! bug) and some reject the whole cookie (Chrome 51 to 66, UC Browser before 12.13.2); for
//! them the attribute is left out, and the cookie behaves as it always did there. The rules
//! are the ones the Chromium project published with the SameSite change.

use std::sync::LazyLock;

use regex::bytes::Regex;

/// Compiled once; the patterns are constants, so they compile.
fn pattern(re: &str) -> Regex {
    #[allow(clippy::expect_used)]
    Regex::new(re).expect("a constant pattern compiles")
}

static IOS: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"\(iP.+; CPU .*OS (\d+)[_\d]*.*\) AppleWebKit/"));
static MACOS: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"\(Macintosh;.*Mac OS X (\d+)_(\d+)[_\d]*.*\) AppleWebKit/"));
static SAFARI: LazyLock<Regex> = LazyLock::new(|| pattern(r"Version/.* Safari/"));
static MAC_EMBEDDED: LazyLock<Regex> = LazyLock::new(|| {
    pattern(
        r"^Mozilla/[\.\d]+ \(Macintosh;.*Mac OS X [_\d]+\) AppleWebKit/[\.\d]+ \(KHTML, like Gecko\)$",
    )
});
static CHROMIUM: LazyLock<Regex> = LazyLock::new(|| pattern(r"Chrom(e|ium)"));
static CHROMIUM_VERSION: LazyLock<Regex> = LazyLock::new(|| pattern(r"Chrom[^ /]+/(\d+)[\.\d]* "));
static UC: LazyLock<Regex> = LazyLock::new(|| pattern(r"UCBrowser/"));
static UC_VERSION: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"UCBrowser/(\d+)\.(\d+)\.(\d+)[\.\d]* "));

/// Whether a browser with this `User-Agent` mishandles `SameSite=None`.
pub(crate) fn incompatible(user_agent: &[u8]) -> bool {
    webkit_bug(user_agent) || drops_unknown_samesite(user_agent)
}

fn number(caps: &regex::bytes::Captures<'_>, i: usize) -> Option<u32> {
    std::str::from_utf8(caps.get(i)?.as_bytes())
        .ok()?
        .parse()
        .ok()
}

fn webkit_bug(ua: &[u8]) -> bool {
    let ios_12 = IOS.captures(ua).is_some_and(|c| number(&c, 1) == Some(12));
    let macos_10_14 = MACOS
        .captures(ua)
        .is_some_and(|c| number(&c, 1) == Some(10) && number(&c, 2) == Some(14));
    let safari = SAFARI.is_match(ua) && !CHROMIUM.is_match(ua);
    ios_12 || (macos_10_14 && (safari || MAC_EMBEDDED.is_match(ua)))
}

fn drops_unknown_samesite(ua: &[u8]) -> bool {
    if UC.is_match(ua) {
        return UC_VERSION.captures(ua).is_some_and(|c| {
            let version = (number(&c, 1), number(&c, 2), number(&c, 3));
            match version {
                (Some(major), Some(minor), Some(build)) => (major, minor, build) < (12, 13, 2),
                _ => false,
            }
        });
    }
    CHROMIUM.is_match(ua)
        && CHROMIUM_VERSION
            .captures(ua)
            .and_then(|c| number(&c, 1))
            .is_some_and(|v| (51..=66).contains(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_browsers_that_mishandle_samesite_none() {
        let cases: &[(&str, bool)] = &[
            // iOS 12, any browser (WebKit).
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 12_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/12.0 Mobile/15E148 Safari/604.1",
                true,
            ),
            (
                "Mozilla/5.0 (iPad; CPU OS 12_4_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/76.0.3809.123 Mobile/15E148 Safari/605.1",
                true,
            ),
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 13_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.0 Mobile/15E148 Safari/604.1",
                false,
            ),
            // macOS 10.14: Safari and embedded browsers, not Chrome.
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/12.1.2 Safari/605.1.15",
                true,
            ),
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) AppleWebKit/605.1.15 (KHTML, like Gecko)",
                true,
            ),
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/80.0.3987.87 Safari/537.36",
                false,
            ),
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/14.0 Safari/605.1.15",
                false,
            ),
            // Chrome 51 to 66.
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/59.0.3071.115 Safari/537.36",
                true,
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/66.0.3359.181 Safari/537.36",
                true,
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/67.0.3396.99 Safari/537.36",
                false,
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/50.0.2661.102 Safari/537.36",
                false,
            ),
            // UC Browser before 12.13.2.
            (
                "Mozilla/5.0 (Linux; U; Android 8.0.0; en-US) AppleWebKit/534.30 (KHTML, like Gecko) Version/4.0 UCBrowser/12.13.0.1207 Mobile Safari/534.30",
                true,
            ),
            (
                "Mozilla/5.0 (Linux; U; Android 8.0.0; en-US) AppleWebKit/534.30 (KHTML, like Gecko) Version/4.0 UCBrowser/12.13.2.1208 Mobile Safari/534.30",
                false,
            ),
            // Everything else, and nonsense.
            (
                "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
                false,
            ),
            ("curl/8.0.1", false),
            ("", false),
        ];
        for (ua, want) in cases {
            assert_eq!(incompatible(ua.as_bytes()), *want, "{ua}");
        }
    }
}
