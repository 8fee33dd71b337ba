//! Starting the real proxy: nothing is answered before the configuration is loaded (3,000
//! Ingresses from manifests, or a 40,000-object cluster), in both modes; `--mode ebpf` fails at
//! startup with the reason when the gate cannot load; `--mode auto` falls back to userspace with
//! one log line and the same policy; and the DaemonSet's capabilities are exactly what eBPF mode
//! needs.
//!
//! The site (namespaces, backend, certificate, manifests, proxies) is `ingress_tests::gate_site`.
//! Without root, kernel BTF or an embedded eBPF object the tests print a loud skip notice and
//! pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use ingress_tests::corpus::corpus;
use ingress_tests::gate_site::{
    KNOWN, MAIN, STEP, Site, WILDCARD, fallback_lines, scrape_until, server,
};
use ingress_tests::process::Ingress;
use ingress_tests::tls_client::{Outcome, assert_fast_reset, http_get, https_get};
use ingress_tests::{Mode, both_modes};
use serde::Deserialize as _;

/// The capabilities deploy/overlays/hostnetwork/daemonset.yaml grants, in setpriv's spelling.
const DAEMONSET_CAPS: [&str; 4] = ["bpf", "perfmon", "net_admin", "net_bind_service"];

both_modes!(nothing_is_answered_before_the_manifests_are_loaded);

/// 3,000 Ingresses from manifests: from the moment the process starts, a served host is either
/// not answered at all (the ports are closed) or answered right, over HTTP and HTTPS.
async fn nothing_is_answered_before_the_manifests_are_loaded(mode: Mode) {
    let Some(site) = Site::new(&format!("startup-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    let mut many = String::new();
    for i in 0..3000 {
        many += &ingress_tests::manifests::ingress(
            "t",
            &format!("filler-{i}"),
            &[(&format!("h{i}.filler.test"), "/", "Prefix", "web")],
        );
    }
    std::fs::write(site.manifests().join("many.yaml"), many).expect("write manifests");
    let proxy = site.proxy().mode(mode).no_wait().start();
    let seen = probe_from_start(&site, KNOWN, 20, Duration::from_secs(60)).await;
    assert_startup(mode, "3,000 Ingresses from manifests", &seen, &proxy);
}

both_modes!(nothing_is_answered_before_the_cluster_is_synced);

/// The Kubernetes source at the kube benchmark's scale (10,000 Ingresses, 10,000 Services,
/// 20,000 EndpointSlices, and the site's own objects): the same from process start.
async fn nothing_is_answered_before_the_cluster_is_synced(mode: Mode) {
    use ingress_tests::apiserver::{ServerOptions, TestApiServer};
    let Some(site) = Site::new(&format!("startup-kube-{}", mode.flag()), &[KNOWN]) else {
        return;
    };
    // The API server lives in the server namespace (this thread's), on its loopback.
    let api = TestApiServer::start_with(ServerOptions::default())
        .await
        .expect("test API server");
    let mut objects = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}),
        serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "ingress"}, "spec": {"controller": "ingress.rs/controller"}}),
    ];
    let site_yaml =
        std::fs::read_to_string(site.manifests().join("site.yaml")).expect("site manifests");
    for document in serde_yaml_ng::Deserializer::from_str(&site_yaml) {
        let value = serde_json::Value::deserialize(document).expect("a manifest");
        if !value.is_null() {
            objects.push(value);
        }
    }
    for i in 0..10_000 {
        objects.push(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": "bench"}, "spec": {"ports": [{"name": "http", "port": 80}]}}));
        for k in 0..2 {
            objects.push(serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("svc-{i}-{k}"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}}, "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": [{"addresses": [format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, k + 1)], "conditions": {"ready": true}}]}));
        }
        objects.push(serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": format!("ing-{i}"), "namespace": "bench"}, "spec": {"ingressClassName": "ingress", "rules": [{"host": format!("h{i}.bench.test"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}}]}}]}}));
    }
    let stored = api.store().seed(objects).expect("seed the cluster");
    assert!(stored > 40_000, "{stored}");
    let kubeconfig = site.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    // The Kubernetes source instead of the site's manifests.
    let proxy = Ingress::builder()
        .kubeconfig(&kubeconfig)
        .pin_dir(site.pins.path())
        .mode(mode)
        .bind("0.0.0.0")
        .ports(MAIN)
        .args(["--access-log", "false"])
        // The backend runs on this host, which the Kubernetes source refuses unless told.
        .args(["--allow-local-backends", "true"])
        .no_wait()
        .start();
    let seen = probe_from_start(&site, KNOWN, 20, Duration::from_secs(120)).await;
    assert_startup(
        mode,
        "the Kubernetes source with 40,000 objects",
        &seen,
        &proxy,
    );
    drop(proxy);
    api.stop().await;
}

/// What probing one port from the moment the process started saw.
#[derive(Debug, Default)]
struct Probed {
    /// Connections refused: the port was not open yet.
    refused: usize,
    served: usize,
    /// Anything else: a 404 for a served host, a reset, a failed handshake.
    wrong: Vec<String>,
}

/// Probes HTTP and HTTPS for `host` from now on, one connection after another, until each
/// has been served `want` times (or `limit` passes): a closed port is fine, as it is for a
/// load balancer's health check, and anything but the right answer is not. The right answer
/// over HTTPS is 200; over HTTP it is the redirect to HTTPS a host with TLS gets (308).
async fn probe_from_start(site: &Site, host: &str, want: usize, limit: Duration) -> [Probed; 2] {
    let mut seen = [Probed::default(), Probed::default()];
    let deadline = Instant::now() + limit;
    while seen.iter().any(|p| p.served < want) && Instant::now() < deadline {
        for (https, probed) in seen.iter_mut().enumerate() {
            if probed.served >= want {
                continue;
            }
            let port = if https == 1 { MAIN.https } else { MAIN.http };
            let socket = site.pair.client.tcp_sockets(1).pop().expect("a socket");
            let stream = match tokio::time::timeout(STEP, socket.connect(server(port))).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    probed.refused += 1;
                    continue;
                }
                other => {
                    probed.wrong.push(format!("connect: {other:?}"));
                    continue;
                }
            };
            let (outcome, right) = if https == 1 {
                (
                    https_get(stream, &site.clients, Some(host), host).await,
                    200,
                )
            } else {
                (http_get(stream, host).await, 308)
            };
            match outcome {
                Outcome::Served(status) if status == right => probed.served += 1,
                other => probed.wrong.push(format!("{other:?}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    seen
}

fn assert_startup(mode: Mode, what: &str, seen: &[Probed; 2], proxy: &Ingress) {
    eprintln!("{mode:?} {what}: http {:?}\n  https {:?}", seen[0], seen[1]);
    for (name, probed) in ["http", "https"].iter().zip(seen) {
        assert!(
            probed.wrong.is_empty(),
            "{what}, {name}: answered before the configuration was loaded: {:?}; logs:\n{}",
            probed.wrong,
            proxy.logs()
        );
        assert!(probed.served > 0, "{what}, {name}: never served");
    }
}

#[tokio::test]
async fn ebpf_mode_fails_at_startup_with_the_reason() {
    let Some(site) = Site::new("fail", &[KNOWN]) else {
        return;
    };
    let not_bpffs = site.dir.path().join("not-bpffs");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--bpf-cgroup", "/nonexistent/cgroup"],
            "opening cgroup /nonexistent/cgroup",
        ),
        (
            &["--gate-interfaces", "lo,nosuch0"],
            "early reset: nosuch0: absent, or neither Ethernet nor loopback",
        ),
        (
            &["--bpf-pin-dir", not_bpffs.to_str().unwrap()],
            "is not on a bpf filesystem",
        ),
    ];
    for (extra, reason) in cases {
        let proxy = site.proxy().ebpf();
        // A --bpf-pin-dir of the case's own replaces the site's.
        let proxy = match extra {
            ["--bpf-pin-dir", dir] => proxy.pin_dir(Path::new(dir)),
            _ => proxy.args(extra.iter().copied()),
        };
        let mut proxy = proxy.no_wait().start();
        let status = proxy.exit_status(Duration::from_secs(20));
        let logs = proxy.logs();
        assert!(!status.success(), "{extra:?} started:\n{logs}");
        assert!(
            logs.contains("error: --mode ebpf: the kernel gate did not load")
                && logs.contains(reason),
            "{extra:?}: the reason is missing:\n{logs}"
        );
        assert!(
            !logs.contains("listening"),
            "{extra:?} listened before failing:\n{logs}"
        );
    }
}

#[tokio::test]
async fn auto_mode_falls_back_with_one_log_line_when_the_cgroup_is_wrong() {
    let Some(site) = Site::new("auto-cgroup", &[KNOWN, WILDCARD]) else {
        return;
    };
    let proxy = site
        .proxy()
        .auto_mode()
        .args(["--bpf-cgroup", "/nonexistent/cgroup"])
        .start();
    let logs = proxy.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(
        lines[0].contains("/nonexistent/cgroup"),
        "the reason: {}",
        lines[0]
    );
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    check_userspace_policy(&site, &proxy).await;
    assert!(!site.pins.join("hosts").exists(), "nothing was pinned");
}

#[tokio::test]
async fn auto_mode_falls_back_with_one_log_line_without_privileges() {
    let Some(site) = Site::new("auto-nobody", &[KNOWN, WILDCARD]) else {
        return;
    };
    // Nobody, allowed only to bind :443 — no BPF, no pins.
    let wrapper = setpriv(Some(65534), &["net_bind_service"]);
    let proxy = site.proxy().auto_mode().wrapper(wrapper).start();
    let logs = proxy.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    eprintln!("{}", lines[0]);
    check_userspace_policy(&site, &proxy).await;
}

/// The policy holds in the fallback: known served, unknown reset fast, wildcard one label only.
async fn check_userspace_policy(site: &Site, proxy: &Ingress) {
    let scrape = proxy.scrape();
    assert_eq!(scrape.value("ingress_ebpf_enabled", &[]), 0.0);
    assert!(
        !scrape.has("ingress_ebpf_gate_total"),
        "kernel counters in userspace mode"
    );
    assert_eq!(
        site.https_get(MAIN.https, Some(KNOWN), KNOWN).await,
        Outcome::Served(200)
    );
    assert_eq!(
        site.https_get(MAIN.https, Some("a.wild.test"), KNOWN).await,
        Outcome::Served(200)
    );
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "fallback: unknown name");
    assert_eq!(
        site.https_get(MAIN.https, Some("b.a.wild.test"), KNOWN)
            .await,
        Outcome::Reset
    );
    let after = scrape_until(proxy, "four decisions", |s| {
        s.gate("pass") - scrape.gate("pass") >= 2.0
            && s.gate("unknown") - scrape.gate("unknown") >= 2.0
    })
    .await;
    assert_eq!(after.gate("pass") - scrape.gate("pass"), 2.0);
    assert_eq!(after.gate("unknown") - scrape.gate("unknown"), 2.0);
}

#[tokio::test]
async fn the_daemonset_capabilities_are_exactly_what_ebpf_mode_needs() {
    let caps = daemonset_caps();
    assert_eq!(
        caps, DAEMONSET_CAPS,
        "deploy/overlays/hostnetwork/daemonset.yaml changed; update this test"
    );
    let Some(site) = Site::new("caps", &[KNOWN]) else {
        return;
    };
    let want: u64 = DAEMONSET_CAPS.iter().map(|c| cap_bit(c)).sum();

    // As the container runs it: uid 0 with only these capabilities.
    let proxy = site
        .proxy()
        .ebpf()
        .wrapper(setpriv(None, &DAEMONSET_CAPS))
        .start();
    assert_eq!(
        status_caps(proxy.pid(), "CapEff:"),
        want,
        "the emulation is exact"
    );
    assert_eq!(
        status_caps(proxy.pid(), "CapBnd:"),
        want,
        "the emulation is exact"
    );
    check_kernel_gates(&site, &proxy).await;
    drop(proxy);

    // As an unprivileged uid with the same capabilities, given a pin directory it owns.
    let _ = std::fs::remove_dir_all(site.pins.path());
    std::fs::create_dir_all(site.pins.path()).expect("pin dir");
    let path = std::ffi::CString::new(site.pins.path().to_str().unwrap()).unwrap();
    // SAFETY: a valid path; chown has no other preconditions.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
    let proxy = site
        .proxy()
        .ebpf()
        .wrapper(setpriv(Some(65534), &DAEMONSET_CAPS))
        .start();
    assert_eq!(status_caps(proxy.pid(), "CapEff:"), want);
    check_kernel_gates(&site, &proxy).await;
    drop(proxy);
    let _ = std::fs::remove_dir_all(site.pins.path());

    // And none of them is superfluous: without any one, --mode ebpf fails at startup.
    for missing in DAEMONSET_CAPS {
        let fewer: Vec<&str> = DAEMONSET_CAPS
            .iter()
            .copied()
            .filter(|c| *c != missing)
            .collect();
        let mut proxy = site
            .proxy()
            .ebpf()
            .wrapper(setpriv(None, &fewer))
            .no_wait()
            .start();
        let status = proxy.exit_status(Duration::from_secs(20));
        let logs = proxy.logs();
        assert!(!status.success(), "started without {missing}:\n{logs}");
        let line = logs
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default();
        eprintln!("without {missing}: {}", &line[..line.len().min(200)]);
        assert!(
            line.contains("Operation not permitted") || line.contains("Permission denied"),
            "without {missing}: {logs}"
        );
        let _ = std::fs::remove_dir_all(site.pins.path());
    }
}

/// `setpriv` arguments that run the binary with exactly `caps` (effective, permitted, inherited,
/// ambient and bounding), as `uid` or, for `None`, as root — which is what a container with
/// `capabilities: {drop: [ALL], add: caps}` and `USER 0` gets.
fn setpriv(uid: Option<u32>, caps: &[&str]) -> Vec<String> {
    let set = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut args: Vec<String> = vec!["setpriv".into()];
    if let Some(uid) = uid {
        args.extend([
            "--reuid".into(),
            uid.to_string(),
            "--regid".into(),
            uid.to_string(),
            "--clear-groups".into(),
        ]);
    }
    args.extend([
        "--inh-caps".into(),
        set.clone(),
        "--ambient-caps".into(),
        set.clone(),
        "--bounding-set".into(),
        set,
    ]);
    args
}

/// Capability numbers from linux/capability.h.
fn cap_bit(name: &str) -> u64 {
    match name {
        "net_bind_service" => 1 << 10,
        "net_admin" => 1 << 12,
        "perfmon" => 1 << 38,
        "bpf" => 1 << 39,
        other => panic!("unexpected capability {other}"),
    }
}

/// The `capabilities.add` list of deploy/overlays/hostnetwork/daemonset.yaml, lowercased.
fn daemonset_caps() -> Vec<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/hostnetwork/daemonset.yaml");
    let yaml: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).expect("daemonset.yaml"))
            .expect("daemonset yaml");
    let context = &yaml["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(context["privileged"], serde_json::Value::Bool(false));
    assert_eq!(context["capabilities"]["drop"], serde_json::json!(["ALL"]));
    context["capabilities"]["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .map(|c| c.as_str().expect("a name").to_ascii_lowercase())
        .collect()
}

fn status_caps(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .expect("capability line")
        .trim();
    u64::from_str_radix(hex, 16).expect("hex capabilities")
}

/// Gating works: a known name served, an unknown one reset, and the kernel counted both.
async fn check_kernel_gates(site: &Site, proxy: &Ingress) {
    let before = proxy.scrape();
    assert_eq!(
        before.value("ingress_ebpf_enabled", &[]),
        1.0,
        "{}",
        proxy.logs()
    );
    assert_eq!(
        site.https_get(MAIN.https, Some(KNOWN), KNOWN).await,
        Outcome::Served(200)
    );
    let ending = site
        .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
        .await;
    assert_fast_reset(&ending, "unknown name");
    let after = scrape_until(proxy, "the kernel counted", |s| {
        s.kernel("pass") > before.kernel("pass") && s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(after.handshakes() - before.handshakes(), 1.0);
}
