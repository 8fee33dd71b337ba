use super::*;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn key() -> ObjectKey {
    ObjectKey::new("ingress", "config")
}

fn resolved(pairs: &[(&str, &str)]) -> (GlobalSettings, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let out = resolve(
        &GlobalSettings::default(),
        &key(),
        Some(&data(pairs)),
        true,
        &mut diagnostics,
    );
    (out, diagnostics)
}

fn nets(s: &str) -> Option<Arc<[IpNet]>> {
    sources::parse_ranges(s).unwrap()
}

#[test]
fn keys_override_the_flags_defaults() {
    let defaults = GlobalSettings::default();
    type Check = fn(&GlobalSettings) -> bool;
    let cases: &[(&[(&str, &str)], Check)] = &[
        (&[("proxy-body-size", "8m")], |g| {
            g.max_body == Some(8 << 20)
        }),
        (&[("proxy-body-size", "0")], |g| g.max_body.is_none()),
        (&[("ssl-redirect", "false")], |g| !g.ssl_redirect),
        (&[("hsts", "false")], |g| !g.hsts.enabled),
        (
            &[
                ("hsts-max-age", "600"),
                ("hsts-include-subdomains", "true"),
                ("hsts-preload", "True"),
            ],
            |g| {
                g.hsts.clone().value().as_ref().map(HeaderValue::as_bytes)
                    == Some(b"max-age=600; includeSubDomains; preload".as_slice())
            },
        ),
        (
            &[
                ("proxy-connect-timeout", "3"),
                ("proxy-read-timeout", "120"),
                ("proxy-send-timeout", "7"),
            ],
            |g| {
                g.timeouts
                    == Timeouts {
                        connect: Duration::from_secs(3),
                        read: Duration::from_secs(120),
                        send: Duration::from_secs(7),
                    }
            },
        ),
        (&[("enable-underscores-in-headers", "1")], |g| g.underscores),
        (&[("server-tokens", "t")], |g| g.server_tokens),
        (
            &[
                ("upstream-keepalive-connections", "0"),
                ("upstream-keepalive-timeout", "30"),
            ],
            |g| {
                g.keepalive
                    == UpstreamKeepalive {
                        idle_timeout: Duration::from_secs(30),
                        max_idle: 0,
                    }
            },
        ),
        (&[("allow-snippet-annotations", "true")], |g| {
            g.allow_snippets
        }),
        (
            &[
                ("use-forwarded-headers", "true"),
                ("forwarded-for-header", "CF-Connecting-IP"),
                ("compute-full-forwarded-for", "true"),
                ("proxy-real-ip-cidr", "10.0.0.0/8, 192.168.1.1"),
            ],
            |g| {
                *g.forwarded
                    == ForwardedPolicy {
                        enabled: true,
                        header: HeaderName::from_static("cf-connecting-ip"),
                        compute_full: true,
                        trusted: nets("10.0.0.0/8,192.168.1.1"),
                    }
            },
        ),
        (
            &[
                ("whitelist-source-range", "10.0.0.0/8"),
                ("denylist-source-range", "10.1.0.0/16"),
            ],
            |g| {
                g.sources.allow == nets("10.0.0.0/8")
                    && Some(g.sources.deny.clone()) == nets("10.1.0.0/16")
            },
        ),
    ];
    for (pairs, check) in cases {
        let (out, diagnostics) = resolved(pairs);
        assert!(check(&out), "{pairs:?}: {out:?}");
        assert!(diagnostics.is_empty(), "{pairs:?}: {diagnostics:?}");
        assert_ne!(out, defaults, "{pairs:?} changed nothing");
    }
}

#[test]
fn invalid_values_keep_the_default_and_say_which_key() {
    let cases: &[(&str, &str)] = &[
        ("proxy-body-size", "lots"),
        ("ssl-redirect", "yes"),
        ("hsts", "on"),
        ("hsts-max-age", "-1"),
        ("proxy-read-timeout", "60s"),
        ("proxy-connect-timeout", "0"),
        ("use-forwarded-headers", "enabled"),
        ("forwarded-for-header", "X Forwarded"),
        ("forwarded-for-header", "Host"),
        ("proxy-real-ip-cidr", "10.0.0.0/33"),
        ("server-tokens", ""),
        ("upstream-keepalive-connections", "-1"),
        ("upstream-keepalive-timeout", "1m"),
    ];
    for (name, value) in cases {
        let (out, diagnostics) = resolved(&[(name, value)]);
        assert_eq!(
            out,
            GlobalSettings::default(),
            "{name}={value:?} must leave the default"
        );
        assert_eq!(diagnostics.len(), 1, "{name}={value:?}: {diagnostics:?}");
        let d = &diagnostics[0];
        assert_eq!(d.kind, DiagnosticKind::InvalidConfigValue);
        assert!(d.message.starts_with(&format!("{name}: ")), "{}", d.message);
        assert_eq!(d.subject, Subject::object(Kind::ConfigMap, &key()));
    }
}

#[test]
fn an_invalid_global_source_range_refuses_rather_than_opens() {
    let (out, diagnostics) = resolved(&[("whitelist-source-range", "10.0.0.0/8, nope")]);
    assert_eq!(out.sources.allow, None);
    let invalid = out.sources_invalid.expect("marked invalid");
    assert!(invalid.allow && !invalid.deny);
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0].severity, crate::diagnostics::Severity::Error);
}

#[test]
fn keys_not_applied_are_each_reported_with_why() {
    let (out, diagnostics) = resolved(&[
        ("load-balance", "ewma"),
        ("log-format-upstream", "$remote_addr"),
        ("ssl-protocols", "TLSv1.2"),
        ("upstream-keepalive-requests", "64"),
        ("worker-processes", "4"),
        ("proxy-protocol-header-timeout", "3s"),
        ("use-proxy-protocol-typo", "true"),
        ("proxy-body-size", "2m"),
    ]);
    assert_eq!(out.max_body, Some(2 << 20), "applied keys still apply");
    let messages: Vec<&str> = diagnostics.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(diagnostics.len(), 7, "{messages:?}");
    assert!(
        diagnostics
            .iter()
            .all(|d| d.kind == DiagnosticKind::UnsupportedConfigKey),
        "{messages:?}"
    );
    for (name, says) in [
        ("load-balance", "not as a global default yet"),
        ("log-format-upstream", "log-format-upstream line"),
        ("ssl-protocols", "rustls"),
        ("upstream-keepalive-requests", "however many requests"),
        ("worker-processes", "accepted, no effect"),
        (
            "proxy-protocol-header-timeout",
            "--proxy-protocol-header-timeout",
        ),
        (
            "use-proxy-protocol-typo",
            "not an ingress-nginx ConfigMap key",
        ),
    ] {
        assert!(
            messages
                .iter()
                .any(|m| m.starts_with(&format!("{name}: ")) && m.contains(says)),
            "{name}: {messages:?}"
        );
    }
}

#[test]
fn use_proxy_protocol_is_read_live_over_the_flag() {
    let (out, diagnostics) = resolved(&[("use-proxy-protocol", "true")]);
    assert!(out.proxy_protocol);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let flag_on = GlobalSettings {
        proxy_protocol: true,
        ..GlobalSettings::default()
    };
    let mut diagnostics = Vec::new();
    let off = BTreeMap::from([("use-proxy-protocol".to_string(), "false".to_string())]);
    let out = resolve(&flag_on, &key(), Some(&off), true, &mut diagnostics);
    assert!(!out.proxy_protocol, "the ConfigMap wins over the flag");
    let out = resolve(
        &flag_on,
        &key(),
        Some(&BTreeMap::new()),
        true,
        &mut diagnostics,
    );
    assert!(out.proxy_protocol, "without the key the flag stays");
    let bad = BTreeMap::from([("use-proxy-protocol".to_string(), "yes please".to_string())]);
    let out = resolve(&flag_on, &key(), Some(&bad), true, &mut diagnostics);
    assert!(out.proxy_protocol, "an invalid value keeps the flag's");
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0].kind, DiagnosticKind::InvalidConfigValue);
}

#[test]
fn a_missing_configmap_is_a_warning_and_the_flags_apply() {
    let mut diagnostics = Vec::new();
    let out = resolve(
        &GlobalSettings::default(),
        &key(),
        None,
        true,
        &mut diagnostics,
    );
    assert_eq!(out, GlobalSettings::default());
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0].kind, DiagnosticKind::ConfigMapNotFound);
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// nginx's `real_ip_recursive on`: from the right, past trusted hops only.
#[test]
fn the_forwarded_chain_is_walked_from_the_right_past_trusted_hops() {
    let trusted = ForwardedPolicy {
        enabled: true,
        trusted: nets("10.0.0.0/8, 2001:db8::/32"),
        ..ForwardedPolicy::default()
    };
    let peer_only = ForwardedPolicy {
        enabled: true,
        ..ForwardedPolicy::default()
    };
    let off = ForwardedPolicy::default();
    let cases: &[(&ForwardedPolicy, &str, &[&str], &str)] = &[
        // Off: the peer, whatever the header says.
        (&off, "10.0.0.1", &["203.0.113.9"], "10.0.0.1"),
        // A trusted balancer appended the client.
        (&trusted, "10.0.0.1", &["203.0.113.9"], "203.0.113.9"),
        // An untrusted peer's header is not believed (spoofing from outside).
        (&trusted, "198.51.100.2", &["10.9.9.9"], "198.51.100.2"),
        // The client's own claim left of the balancer's entry is not believed.
        (
            &trusted,
            "10.0.0.1",
            &["1.2.3.4, 203.0.113.9"],
            "203.0.113.9",
        ),
        // Trusted hops in a row are skipped; the first untrusted one from the right wins.
        (
            &trusted,
            "10.0.0.1",
            &["1.2.3.4, 203.0.113.9, 10.0.0.7, 10.2.0.3"],
            "203.0.113.9",
        ),
        // An untrusted hop in the middle stops the walk there.
        (
            &trusted,
            "10.0.0.1",
            &["10.0.0.5, 198.51.100.7, 10.0.0.3"],
            "198.51.100.7",
        ),
        // Every hop trusted: the leftmost, as nginx.
        (&trusted, "10.0.0.1", &["10.0.0.5, 10.0.0.6"], "10.0.0.5"),
        // Malformed entries stop the walk at the hop to their right.
        (&trusted, "10.0.0.1", &["203.0.113.9, garbage"], "10.0.0.1"),
        (
            &trusted,
            "10.0.0.1",
            &["203.0.113.9, unknown, 10.0.0.4"],
            "10.0.0.4",
        ),
        (&trusted, "10.0.0.1", &["999.1.1.1"], "10.0.0.1"),
        // Ports and brackets, as nginx reads them.
        (&trusted, "10.0.0.1", &["203.0.113.9:4711"], "203.0.113.9"),
        (&trusted, "10.0.0.1", &["[2001:db9::1]:443"], "2001:db9::1"),
        (
            &trusted,
            "10.0.0.1",
            &["2001:db8::5, 2001:db9::1"],
            "2001:db9::1",
        ),
        // Several headers are one list, in order.
        (
            &trusted,
            "10.0.0.1",
            &["203.0.113.9", "10.0.0.8"],
            "203.0.113.9",
        ),
        (
            &trusted,
            "10.0.0.1",
            &["10.0.0.8", "198.51.100.1"],
            "198.51.100.1",
        ),
        // Empty entries and an empty header are skipped.
        (&trusted, "10.0.0.1", &[" , 203.0.113.9 ,, "], "203.0.113.9"),
        (&trusted, "10.0.0.1", &[""], "10.0.0.1"),
        (&trusted, "10.0.0.1", &[], "10.0.0.1"),
        // An IPv4-mapped peer is judged as the IPv4 address it is.
        (&trusted, "::ffff:10.0.0.1", &["203.0.113.9"], "203.0.113.9"),
        // Without proxy-real-ip-cidr only the peer is trusted: one hop, the rightmost.
        (
            &peer_only,
            "198.51.100.2",
            &["1.2.3.4, 203.0.113.9"],
            "203.0.113.9",
        ),
        (
            &peer_only,
            "198.51.100.2",
            &["10.0.0.5, 10.0.0.6"],
            "10.0.0.6",
        ),
    ];
    for (policy, peer, values, want) in cases {
        let values: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
        let got = policy.client(ip(peer), values.iter().copied());
        assert_eq!(got, ip(want), "{peer} {values:?}");
    }
}

#[test]
fn an_over_long_chain_is_believed_only_up_to_its_bound() {
    let policy = ForwardedPolicy {
        enabled: true,
        trusted: nets("10.0.0.0/8"),
        ..ForwardedPolicy::default()
    };
    // A client hop far left, then more trusted hops than are walked.
    let mut chain = String::from("203.0.113.9");
    for i in 0..MAX_HOPS + 10 {
        chain.push_str(&format!(", 10.0.{}.{}", i / 200, i % 200 + 1));
    }
    let got = policy.client(ip("10.0.0.1"), [chain.as_bytes()].into_iter());
    assert!(
        policy.trusts(got, false),
        "the walk stops at a trusted hop, never reaching the far claim: {got}"
    );
    assert_ne!(got, ip("203.0.113.9"));
}

#[test]
fn hops_parse_as_nginx_reads_them() {
    for (entry, want) in [
        ("192.0.2.1", Some("192.0.2.1")),
        ("192.0.2.1:80", Some("192.0.2.1")),
        ("2001:db8::1", Some("2001:db8::1")),
        ("[2001:db8::1]", Some("2001:db8::1")),
        ("[2001:db8::1]:8080", Some("2001:db8::1")),
        ("[2001:db8::1]:x", None),
        ("192.0.2.1:99999", None),
        ("unknown", None),
        ("_hidden", None),
        ("", None),
    ] {
        assert_eq!(parse_hop(entry.as_bytes()), want.map(ip), "{entry}");
    }
}

#[test]
fn an_unsupported_global_access_control_refuses_every_route_unless_ignored() {
    let (out, diagnostics) = resolved(&[
        ("block-cidrs", "198.51.100.0/24"),
        ("block-user-agents", ""),
    ]);
    assert!(out.access_refused.is_some(), "block-cidrs set: refused");
    assert_eq!(diagnostics.len(), 2, "{diagnostics:?}");
    assert!(
        diagnostics
            .iter()
            .any(|d| d.severity == crate::diagnostics::Severity::Error
                && d.message.starts_with("block-cidrs: "))
    );
    let mut diagnostics = Vec::new();
    let out = resolve(
        &GlobalSettings::default(),
        &key(),
        Some(&data(&[("block-cidrs", "198.51.100.0/24")])),
        false,
        &mut diagnostics,
    );
    assert!(out.access_refused.is_none());
    assert!(
        diagnostics[0].message.contains("WITHOUT"),
        "{diagnostics:?}"
    );
}

/// docs/configmap.md lists every key with the status the code gives it.
#[test]
fn the_reference_agrees_with_the_code() {
    let doc = include_str!("../../../../docs/configmap.md");
    let (applied, rest) = doc.split_once("## Keys not applied").expect("two sections");
    let keys = |text: &str| -> Vec<(String, String)> {
        text.lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| {
                let (key, rest) = l.split_once('`')?;
                let status = rest.trim_start_matches(" |").split('|').next()?.trim();
                Some((key.to_string(), status.to_string()))
            })
            .collect()
    };
    let applied = keys(applied);
    assert_eq!(applied.len(), 38, "{applied:?}");
    for (key, _) in &applied {
        assert_eq!(key_status(key), Some(KeyStatus::Applied), "{key}");
    }
    let rest = keys(rest);
    assert!(rest.len() > 150, "{}", rest.len());
    for (key, status) in rest {
        let want = match key_status(&key) {
            Some(KeyStatus::StartupOnly(_)) => "startup only",
            Some(KeyStatus::Noop(_)) => "no effect",
            Some(KeyStatus::Unsupported(_)) => "unsupported",
            other => panic!("{key}: {other:?} in the table of keys not applied"),
        };
        assert_eq!(status, want, "{key}");
    }
}

#[test]
fn custom_http_errors_and_intercept() {
    // (data, codes, intercept disabled, diagnostics)
    let cases: &[(&[(&str, &str)], &[u16], bool, usize)] = &[
        (&[], &[], false, 0),
        (&[("custom-http-errors", "503, 404")], &[404, 503], false, 0),
        (&[("custom-http-errors", "404,200,nope")], &[404], false, 2),
        (
            &[
                ("custom-http-errors", "404"),
                ("disable-proxy-intercept-errors", "true"),
            ],
            &[404],
            true,
            0,
        ),
        (
            &[("disable-proxy-intercept-errors", "maybe")],
            &[],
            false,
            1,
        ),
    ];
    for (data, codes, disabled, problems) in cases {
        let (out, diagnostics) = resolved(data);
        assert_eq!(&*out.custom_http_errors, *codes, "{data:?}");
        assert_eq!(out.disable_intercept, *disabled, "{data:?}");
        assert_eq!(diagnostics.len(), *problems, "{data:?}: {diagnostics:?}");
    }
}

#[test]
fn the_rate_limit_status_codes() {
    // (data, req status, conn status, diagnostics)
    let cases: &[(&[(&str, &str)], u16, u16, usize)] = &[
        (&[], 503, 503, 0),
        (&[("limit-req-status-code", "429")], 429, 503, 0),
        (&[("limit-conn-status-code", " 429 ")], 503, 429, 0),
        (&[("limit-req-status-code", "200")], 503, 503, 1),
        (&[("limit-req-status-code", "many")], 503, 503, 1),
    ];
    let key = ObjectKey::new("ingress", "config");
    for (data, req, conn, problems) in cases {
        let data: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut diagnostics = Vec::new();
        let out = resolve(
            &GlobalSettings::default(),
            &key,
            Some(&data),
            true,
            &mut diagnostics,
        );
        assert_eq!(
            (
                out.limit_req_status,
                out.limit_conn_status,
                diagnostics.len()
            ),
            (*req, *conn, *problems),
            "{data:?}: {diagnostics:?}"
        );
    }
}
