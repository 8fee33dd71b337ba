//! The `auth-tls-*` annotations (client certificates), read as ingress-nginx reads them:
//!
//! ```text
//!   auth-tls-secret                        ns/name (or name): the Secret with ca.crt [+ ca.crl]
//!   auth-tls-verify-client                 on (default) | off | optional | optional_no_ca
//!   auth-tls-verify-depth                  1 (default): how long a chain may be
//!   auth-tls-error-page                    where a failed client is redirected (302)
//!   auth-tls-pass-certificate-to-upstream  "true": the ssl-client-cert header
//!   auth-tls-match-cn                      CN=<regex>: the subject DN must match (else 403)
//! ```
//!
//! Nothing here reads the Secret: the build does (`snapshot::client_auth`). A value that would
//! weaken the check if guessed (the Secret, match-cn, pass-certificate) is an error that keeps
//! the Ingress from being served; verify-client and verify-depth fall back to the strictest
//! value, as ingress-nginx falls back to its defaults.

use std::collections::BTreeMap;

use regex::Regex;

use super::lookup;

pub const DEFAULT_DEPTH: u32 = 1;

/// `auth-tls-verify-client`: nginx's `ssl_verify_client`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyClient {
    /// A valid certificate is required (400 otherwise).
    #[default]
    On,
    /// No certificate is asked for.
    Off,
    /// A certificate is asked for; none is accepted, an invalid one is not.
    Optional,
    /// As `Optional`, and a certificate whose issuer is unknown is accepted too (its
    /// `ssl-client-verify` says FAILED); an expired or revoked one is not.
    OptionalNoCa,
}

impl VerifyClient {
    pub fn parse(value: &str) -> Option<VerifyClient> {
        match value.trim() {
            "on" => Some(VerifyClient::On),
            "off" => Some(VerifyClient::Off),
            "optional" => Some(VerifyClient::Optional),
            "optional_no_ca" => Some(VerifyClient::OptionalNoCa),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VerifyClient::On => "on",
            VerifyClient::Off => "off",
            VerifyClient::Optional => "optional",
            VerifyClient::OptionalNoCa => "optional_no_ca",
        }
    }
}

/// What an Ingress's `auth-tls-*` annotations ask for.
#[derive(Clone, Debug)]
pub struct AuthTls {
    /// `auth-tls-secret`: (namespace, name); the namespace is the Ingress's when not given.
    pub secret: (Option<String>, String),
    pub verify: VerifyClient,
    pub depth: u32,
    /// An absolute `http`/`https` URL.
    pub error_page: Option<String>,
    pub pass_certificate: bool,
    /// The whole `auth-tls-match-cn` value (`CN=` included) as a regex over the subject DN,
    /// unanchored, as nginx's `$ssl_client_s_dn !~ "<value>"`.
    pub match_cn: Option<Regex>,
}

impl PartialEq for AuthTls {
    fn eq(&self, other: &Self) -> bool {
        self.secret == other.secret
            && self.verify == other.verify
            && self.depth == other.depth
            && self.error_page == other.error_page
            && self.pass_certificate == other.pass_certificate
            && self.match_cn.as_ref().map(Regex::as_str)
                == other.match_cn.as_ref().map(Regex::as_str)
    }
}

impl Eq for AuthTls {}

/// What parsing found: the options (when `auth-tls-secret` is set), errors that keep the
/// Ingress from being served, and warnings about values replaced by a default.
#[derive(Debug, Default)]
pub struct Parsed {
    pub auth: Option<AuthTls>,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// Reads the `auth-tls-*` annotations. Without `auth-tls-secret` the others do nothing (as in
/// ingress-nginx) and are reported as a warning.
pub fn parse(annotations: Option<&BTreeMap<String, String>>) -> Parsed {
    let mut parsed = Parsed::default();
    let Some(annotations) = annotations else {
        return parsed;
    };
    let Some((key, secret)) = lookup(annotations, "auth-tls-secret") else {
        for name in [
            "auth-tls-verify-client",
            "auth-tls-verify-depth",
            "auth-tls-error-page",
            "auth-tls-pass-certificate-to-upstream",
            "auth-tls-match-cn",
        ] {
            if let Some((key, _)) = lookup(annotations, name) {
                parsed.warnings.push(format!(
                    "{key} has no effect without auth-tls-secret (as in ingress-nginx)"
                ));
            }
        }
        return parsed;
    };
    let secret = match parse_secret(secret) {
        Some(s) => s,
        None => {
            parsed.errors.push(format!(
                "{key}: {secret:?} is not a Secret name (`namespace/name` or `name`)"
            ));
            return parsed;
        }
    };
    let verify = match lookup(annotations, "auth-tls-verify-client") {
        None => VerifyClient::On,
        Some((key, value)) => VerifyClient::parse(value).unwrap_or_else(|| {
            parsed.warnings.push(format!(
                "{key}: {value:?} is not on, off, optional or optional_no_ca; \"on\" is used (as ingress-nginx does)"
            ));
            VerifyClient::On
        }),
    };
    let depth = match lookup(annotations, "auth-tls-verify-depth") {
        None => DEFAULT_DEPTH,
        Some((key, value)) => match value.trim().parse::<u32>() {
            // ingress-nginx reads 0 as "unset" too.
            Ok(0) => DEFAULT_DEPTH,
            Ok(n) if n <= 100 => n,
            _ => {
                parsed.warnings.push(format!(
                    "{key}: {value:?} is not a whole number in 1..=100; {DEFAULT_DEPTH} is used (as ingress-nginx does)"
                ));
                DEFAULT_DEPTH
            }
        },
    };
    let error_page = lookup(annotations, "auth-tls-error-page").and_then(|(key, value)| {
        let value = value.trim();
        if is_absolute_url(value) {
            Some(value.to_string())
        } else {
            parsed.warnings.push(format!(
                "{key}: {value:?} is not an absolute http(s) URL; only those are supported (nginx's internal error_page targets are not), so a refused client gets the 400 page instead"
            ));
            None
        }
    });
    let pass_certificate = match lookup(annotations, "auth-tls-pass-certificate-to-upstream") {
        None => false,
        Some((key, value)) => match value.trim() {
            "true" => true,
            "false" => false,
            _ => {
                parsed
                    .errors
                    .push(format!("{key}: {value:?} is not \"true\" or \"false\""));
                false
            }
        },
    };
    let match_cn = lookup(annotations, "auth-tls-match-cn").and_then(|(key, value)| {
        if !value.starts_with("CN=") {
            parsed.errors.push(format!(
                "{key}: {value:?} must start with \"CN=\" (as ingress-nginx requires)"
            ));
            return None;
        }
        match Regex::new(value) {
            Ok(regex) => Some(regex),
            Err(err) => {
                parsed
                    .errors
                    .push(format!("{key}: {value:?} is not a valid regex: {err}"));
                None
            }
        }
    });
    if parsed.errors.is_empty() {
        parsed.auth = Some(AuthTls {
            secret,
            verify,
            depth,
            error_page,
            pass_certificate,
            match_cn,
        });
    }
    parsed
}

/// `namespace/name` or `name`, each a DNS-1123 subdomain's characters.
fn parse_secret(value: &str) -> Option<(Option<String>, String)> {
    let value = value.trim();
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match value.split_once('/') {
        Some((ns, name)) if valid(ns) && valid(name) => Some((Some(ns.into()), name.into())),
        None if valid(value) => Some((None, value.into())),
        _ => None,
    }
}

fn is_absolute_url(value: &str) -> bool {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"));
    rest.is_some_and(|r| {
        !r.is_empty() && !r.starts_with('/') && r.bytes().all(|b| b.is_ascii_graphic())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::annotations::NGINX_PREFIX;

    fn parse_pairs(pairs: &[(&str, &str)]) -> Parsed {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string()))
            .collect();
        parse(Some(&map))
    }

    #[test]
    fn table() {
        struct Case {
            pairs: &'static [(&'static str, &'static str)],
            secret: Option<(Option<&'static str>, &'static str)>,
            verify: VerifyClient,
            depth: u32,
            errors: usize,
            warnings: usize,
        }
        let cases = [
            Case {
                pairs: &[],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 0,
            },
            Case {
                pairs: &[("auth-tls-verify-client", "off")],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 1,
            },
            Case {
                pairs: &[("auth-tls-secret", "default/ca")],
                secret: Some((Some("default"), "ca")),
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 0,
            },
            Case {
                pairs: &[
                    ("auth-tls-secret", "ca"),
                    ("auth-tls-verify-client", "optional_no_ca"),
                    ("auth-tls-verify-depth", "3"),
                ],
                secret: Some((None, "ca")),
                verify: VerifyClient::OptionalNoCa,
                depth: 3,
                errors: 0,
                warnings: 0,
            },
            Case {
                pairs: &[
                    ("auth-tls-secret", "ca"),
                    ("auth-tls-verify-client", "sometimes"),
                    ("auth-tls-verify-depth", "-1"),
                ],
                secret: Some((None, "ca")),
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 2,
            },
            Case {
                pairs: &[("auth-tls-secret", "ca"), ("auth-tls-verify-depth", "0")],
                secret: Some((None, "ca")),
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 0,
            },
            Case {
                pairs: &[("auth-tls-secret", "a/b/c")],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 1,
                warnings: 0,
            },
            Case {
                pairs: &[("auth-tls-secret", "ca"), ("auth-tls-match-cn", "client")],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 1,
                warnings: 0,
            },
            Case {
                pairs: &[("auth-tls-secret", "ca"), ("auth-tls-match-cn", "CN=(a")],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 1,
                warnings: 0,
            },
            Case {
                pairs: &[
                    ("auth-tls-secret", "ca"),
                    ("auth-tls-pass-certificate-to-upstream", "yes"),
                ],
                secret: None,
                verify: VerifyClient::On,
                depth: 1,
                errors: 1,
                warnings: 0,
            },
            Case {
                pairs: &[("auth-tls-secret", "ca"), ("auth-tls-error-page", "/error")],
                secret: Some((None, "ca")),
                verify: VerifyClient::On,
                depth: 1,
                errors: 0,
                warnings: 1,
            },
        ];
        for case in cases {
            let got = parse_pairs(case.pairs);
            assert_eq!(got.errors.len(), case.errors, "{:?}: {got:?}", case.pairs);
            assert_eq!(
                got.warnings.len(),
                case.warnings,
                "{:?}: {got:?}",
                case.pairs
            );
            let want = case
                .secret
                .map(|(ns, name)| (ns.map(str::to_string), name.to_string()));
            assert_eq!(
                got.auth.as_ref().map(|a| a.secret.clone()),
                want,
                "{:?}",
                case.pairs
            );
            if let Some(auth) = got.auth {
                assert_eq!(auth.verify, case.verify, "{:?}", case.pairs);
                assert_eq!(auth.depth, case.depth, "{:?}", case.pairs);
            }
        }
    }

    #[test]
    fn options_are_kept() {
        let got = parse_pairs(&[
            ("auth-tls-secret", "ns/ca"),
            (
                "auth-tls-error-page",
                "https://login.example.com/cert-error",
            ),
            ("auth-tls-pass-certificate-to-upstream", "true"),
            ("auth-tls-match-cn", "CN=(alice|bob)"),
        ]);
        let auth = got.auth.unwrap();
        assert_eq!(
            auth.error_page.as_deref(),
            Some("https://login.example.com/cert-error")
        );
        assert!(auth.pass_certificate);
        let cn = auth.match_cn.unwrap();
        assert!(cn.is_match("CN=bob,O=Example"));
        assert!(!cn.is_match("CN=carol,O=Example"));
    }
}
