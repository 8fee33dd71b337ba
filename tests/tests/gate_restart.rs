//! The kernel state a proxy leaves behind, across restarts: what is pinned and attached while it
//! runs, what a clean exit detaches and unpins (only the per-run maps; the policy and counters
//! stay), what a SIGKILL leaves and the next start replaces, a second instance on the same pins
//! (refused, harming nothing), and a restart that never empties the pinned HOSTS. eBPF mode only:
//! userspace mode has no kernel state.
//!
//! The site (namespaces, backend, certificate, manifests, proxies) is `ingress_tests::gate_site`;
//! the kernel is read with `ingress_tests::bpftool`. Without root, kernel BTF or an embedded eBPF
//! object the tests print a loud skip notice and pass — unless CI=true, where that is a failure.

// Setup helpers fail the test with a message, as the test bodies do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ingress_tests::Mode;
use ingress_tests::bpftool::{
    cgroup_attached, host_names, map_exists, pinned_maps, programs_using, tc_attached,
};
use ingress_tests::corpus::corpus;
use ingress_tests::gate_site::{KNOWN, MAIN, SECOND, STEP, Site, fallback_lines, scrape_until};
use ingress_tests::process::Ingress;
use ingress_tests::tls_client::{Outcome, assert_fast_reset};

/// The pins the policy (names and source ranges) and counters live in: kept across restarts.
/// Every other pin belongs to one run.
const KEPT_PINS: [&str; 4] = ["config", "counters", "hosts", "sources"];

#[tokio::test]
async fn load_then_restart_on_the_same_pins_then_load_again() {
    let Some(site) = Site::new("restart", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.path().to_path_buf();
    let mut first = site.start(Mode::Ebpf, &[]);
    some_load(&site, &first, 30).await;
    let counted = scrape_until(&first, "30 passes", |s| s.kernel("pass") >= 30.0).await;
    let maps = pinned_maps(&pins);
    for pin in KEPT_PINS.iter().chain(&["socks", "verdicts"]) {
        assert!(maps.contains_key(*pin), "{pin} is not pinned: {maps:?}");
    }
    let ids: BTreeSet<u64> = maps.values().copied().collect();
    let programs = programs_using(&ids);
    let names: BTreeSet<&str> = programs.iter().map(|(_, n)| n.as_str()).collect();
    for program in [
        "gate_probe",
        "gate_parser",
        "gate_verdict",
        "gate_sock_ops",
        "gate_early",
    ] {
        assert!(
            names.contains(program),
            "{program} is not loaded: {programs:?}"
        );
    }
    let sock_ops = programs
        .iter()
        .find(|(_, n)| n == "gate_sock_ops")
        .map(|(id, _)| *id)
        .expect("sock_ops");
    assert!(
        cgroup_attached().contains(&sock_ops),
        "sock_ops is attached"
    );
    let early = programs
        .iter()
        .find(|(_, n)| n == "gate_early")
        .map(|(id, _)| *id)
        .expect("gate_early");
    // Both of the server namespace's interfaces: its loopback and its end of the veth.
    assert_eq!(tc_attached().get(&early), Some(&2), "gate_early links");
    assert!(
        first.logs().contains("early_reset=[\"lo\", "),
        "{}",
        first.logs()
    );

    // SIGTERM: a clean exit detaches everything and unpins only the per-socket maps.
    first.signal(libc::SIGTERM);
    let status = first.exit_status(Duration::from_secs(40));
    assert!(status.success(), "{status}; logs:\n{}", first.logs());
    assert!(
        first.logs().contains("kernel gate detached"),
        "{}",
        first.logs()
    );
    assert_eq!(
        programs_using(&ids),
        vec![],
        "programs outlived the process that loaded them"
    );
    assert!(
        !cgroup_attached().contains(&sock_ops),
        "sock_ops still attached"
    );
    assert!(
        !tc_attached().contains_key(&early),
        "gate_early still attached"
    );
    let left = pinned_maps(&pins);
    assert_eq!(
        left.keys().map(String::as_str).collect::<Vec<_>>(),
        KEPT_PINS,
        "only the policy and the counters stay pinned"
    );
    // A program's maps are released after an RCU grace period and a workqueue run, once the
    // program itself is already gone from the listing: give the kernel a bounded moment.
    for (pin, id) in &maps {
        if !KEPT_PINS.contains(&pin.as_str()) {
            let released = Instant::now();
            while map_exists(*id) && released.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(!map_exists(*id), "{pin} (map {id}) outlived its run by 5 s");
        }
    }
    assert_eq!(host_names(&pins), BTreeSet::from([KNOWN.to_string()]));

    // Start again on the same pins: the policy maps and counters are reused.
    let second = site.start(Mode::Ebpf, &[]);
    let reused = pinned_maps(&pins);
    for pin in KEPT_PINS {
        assert_eq!(reused[pin], maps[pin], "{pin} was replaced, not reused");
    }
    assert!(
        !second.logs().contains("replacing a pinned map"),
        "{}",
        second.logs()
    );
    some_load(&site, &second, 30).await;
    let last = scrape_until(&second, "60 passes", |s| s.kernel("pass") >= 60.0).await;
    assert!(
        last.kernel("pass") >= counted.kernel("pass") + 30.0,
        "counters survive"
    );
    assert!(last.kernel("unknown") >= counted.kernel("unknown") + 30.0);
    drop(second);
}

#[tokio::test]
async fn a_killed_proxy_leaves_no_gate_attached_and_a_restart_replaces_its_remains() {
    let Some(site) = Site::new("killed", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.path().to_path_buf();
    let mut first = site.start(Mode::Ebpf, &[]);
    some_load(&site, &first, 5).await;
    let maps = pinned_maps(&pins);
    let ids: BTreeSet<u64> = maps.values().copied().collect();
    let programs = programs_using(&ids);
    let find = |name: &str| {
        programs
            .iter()
            .find(|(_, n)| n == name)
            .map(|(id, _)| *id)
            .unwrap_or_else(|| panic!("{name} is not loaded: {programs:?}"))
    };
    let (sock_ops, early) = (find("gate_sock_ops"), find("gate_early"));
    assert!(tc_attached().contains_key(&early), "gate_early is attached");

    first.signal(libc::SIGKILL);
    first.exit_status(STEP);
    // The cgroup and TCX links died with the process, so nothing gates any more; the
    // per-socket pins (and the stream programs attached to SOCKS) remain until the next start
    // replaces them.
    assert!(
        !cgroup_attached().contains(&sock_ops),
        "sock_ops outlived a SIGKILL"
    );
    assert!(
        !tc_attached().contains_key(&early),
        "gate_early outlived a SIGKILL"
    );
    assert!(pins.join("socks").exists() && pins.join("verdicts").exists());

    let second = site.start(Mode::Ebpf, &[]);
    let logs = second.logs();
    for pin in ["socks", "verdicts"] {
        assert!(
            logs.contains(&format!(
                "replacing a pinned map path={}",
                pins.join(pin).display()
            )),
            "{pin} not replaced:\n{logs}"
        );
    }
    assert!(!map_exists(maps["socks"]), "the old SOCKS is gone");
    let left: Vec<String> = programs_using(&BTreeSet::from([maps["socks"], maps["verdicts"]]))
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert!(
        left.is_empty(),
        "programs of the killed run remain: {left:?}"
    );
    some_load(&site, &second, 5).await;
}

/// Two processes on one pin directory: the second does not load the gate (`--mode ebpf` fails
/// naming the first's pid; `--mode auto` falls back with one log line), and when it exits the
/// first's pins, policy and gate are exactly as they were.
#[tokio::test]
async fn a_second_instance_on_the_same_pins_is_refused_and_harms_nothing() {
    let Some(site) = Site::new("shared-pins", &[KNOWN]) else {
        return;
    };
    let pins = site.pins.path().to_path_buf();
    let first = site.start(Mode::Ebpf, &[]);
    let maps = pinned_maps(&pins);
    let hosts = host_names(&pins);
    let owner = format!("is in use by another ingress process (pid {})", first.pid());

    let mut second = site.proxy().ebpf().ports(SECOND).no_wait().start();
    let status = second.exit_status(Duration::from_secs(20));
    let logs = second.logs();
    assert!(!status.success(), "a second owner started:\n{logs}");
    assert!(
        logs.contains("--mode ebpf: the kernel gate did not load") && logs.contains(&owner),
        "the reason is missing:\n{logs}"
    );

    let third = site.proxy().auto_mode().ports(SECOND).start();
    let logs = third.logs();
    let lines = fallback_lines(&logs);
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(lines[0].contains(&owner), "{}", lines[0]);
    assert_eq!(third.scrape().value("ingress_ebpf_enabled", &[]), 0.0);
    assert_eq!(site.curl_port(KNOWN, SECOND.https).await, Ok(200));
    drop(third);

    assert_eq!(
        pinned_maps(&pins),
        maps,
        "the first instance's pins changed"
    );
    assert_eq!(host_names(&pins), hosts);
    let before = first.scrape();
    assert_eq!(site.curl(KNOWN).await, Ok(200));
    assert_fast_reset(
        &site
            .send(MAIN.https, &[&corpus("curl-tls13.bin")], Duration::ZERO)
            .await,
        "the first instance still refuses unknown names",
    );
    let after = scrape_until(&first, "one unknown", |s| {
        s.kernel("unknown") > before.kernel("unknown")
    })
    .await;
    assert_eq!(
        after.kernel("reset_before_accept_unknown") - before.kernel("reset_before_accept_unknown"),
        1.0,
        "{}",
        after.0
    );
}

/// A restart reuses the pinned HOSTS as they are: nothing is written to them until a snapshot
/// from synced sources is published, and then only what changed.
#[tokio::test]
async fn a_restart_never_empties_the_pinned_hosts() {
    let Some(site) = Site::new("restart-hosts", &[KNOWN, "stay.test"]) else {
        return;
    };
    let pins = site.pins.path().to_path_buf();
    let mut first = site.start(Mode::Ebpf, &[]);
    first.signal(libc::SIGTERM);
    assert!(first.exit_status(Duration::from_secs(40)).success());
    let hosts = host_names(&pins);
    assert_eq!(
        hosts,
        BTreeSet::from([KNOWN.to_string(), "stay.test".to_string()])
    );
    let id = pinned_maps(&pins)["hosts"];

    let second = site
        .proxy()
        .ebpf()
        .log_level("info,ingress::gate=debug")
        .start();
    let logs = second.logs();
    let removals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("kernel host policy synced") && !l.contains("removed=0"))
        .collect();
    assert!(
        removals.is_empty(),
        "names were removed from the pinned HOSTS at startup: {removals:?}"
    );
    assert_eq!(pinned_maps(&pins)["hosts"], id, "HOSTS was replaced");
    assert_eq!(host_names(&pins), hosts);
    assert_eq!(site.curl(KNOWN).await, Ok(200));
}

/// Known names served and unknown ones reset, `n` of each, a few at a time.
async fn some_load(site: &Site, proxy: &Ingress, n: usize) {
    for i in 0..n {
        let unknown = format!("nobody-{i}.test");
        let (served, reset) = tokio::join!(
            site.https_get(MAIN.https, Some(KNOWN), KNOWN),
            site.https_get(MAIN.https, Some(&unknown), KNOWN)
        );
        assert_eq!(
            served,
            Outcome::Served(200),
            "#{i}; logs:\n{}",
            proxy.logs()
        );
        assert_eq!(reset, Outcome::Reset, "#{i}; logs:\n{}", proxy.logs());
    }
}
