//! What the `kube_*` tests share: a test API server with a kubeconfig, the system kubectl
//! pointed at it, the real `ingress` binary watching it, and continuous traffic that records
//! every answer.
//!
//! ```text
//!   kubectl --kubeconfig ──> TestApiServer (in this process) <── watches ── ingress (child)
//!                                                                            │ :http
//!   Traffic (hyper, a loop) ────────────────────────────────────────────────┘──> Backend(s)
//! ```

// Test support: a failed setup step should stop the test at once with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each test file uses a different part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingress_tests::apiserver::{RequestRecord, ServerOptions, TestApiServer};
use ingress_tests::client::{self, HttpClient};
use ingress_tests::manifests::{ingress, one_route};
use ingress_tests::process::{Ingress, IngressBuilder};
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

/// Generous: two CPUs are shared with other builds and tests.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The IngressClass the Ingresses of these tests name.
pub const CLASS: &str = "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: ingress}\nspec: {controller: ingress.rs/controller}\n";

/// The site most of these tests start from: the IngressClass, the Service `app/web` on `web`,
/// and the Ingress `app/web` routing `web.example.com` to it.
pub fn web_site(web: &Backend) -> String {
    CLASS.to_string() + &one_route("app", "web", "web.example.com", web)
}

/// The Ingress `app/NAME` routing `NAME.example.com` to the Service `web`: what a test applies
/// to see a change routed (and its status written) while something else goes on.
pub fn web_ingress(name: &str) -> String {
    ingress(
        "app",
        name,
        &[(&format!("{name}.example.com"), "/", "Prefix", "web")],
    )
}

/// A test API server, a kubeconfig for it and a kubectl that uses it.
pub struct Cluster {
    pub server: TestApiServer,
    pub dir: Scratch,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let server = TestApiServer::start_with(ServerOptions {
            bookmark_interval: Duration::from_millis(500),
            ..ServerOptions::default()
        })
        .await
        .expect("test API server starts");
        let dir = Scratch::new("kube-test");
        let kubeconfig = dir.path().join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig written");
        Cluster {
            server,
            dir,
            kubeconfig,
        }
    }

    /// The controller, watching this cluster (no `--manifests`). Not waited for. The test
    /// backends listen on loopback, which the Kubernetes source refuses by default.
    pub fn ingress(&self) -> IngressBuilder {
        Ingress::builder()
            .no_wait()
            .arg("--kubeconfig")
            .arg(self.kubeconfig.to_string_lossy().into_owned())
            .arg("--allow-local-backends")
    }

    /// An instance that names itself `pod_name` (its identity in the Lease and in the
    /// User-Agent of its writes) and publishes `publish_address`, with a Lease short enough
    /// for a test to see it change hands.
    pub fn instance(
        &self,
        pod_name: &str,
        publish_address: &str,
        lease_duration: &str,
    ) -> IngressBuilder {
        self.ingress().args([
            "--pod-name",
            pod_name,
            "--publish-address",
            publish_address,
            "--lease-duration",
            lease_duration,
        ])
    }

    pub async fn kubectl(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .kill_on_drop(true);
        tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("kubectl runs")
    }

    /// Runs kubectl, asserts success, returns stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `kubectl apply -f` of `yaml` (written to a scratch file).
    pub async fn apply(&self, yaml: &str) -> String {
        let path = self.manifest(yaml);
        self.ok(&["apply", "-f", &path]).await
    }

    /// `kubectl delete -f` of `yaml`.
    pub async fn delete(&self, yaml: &str) -> String {
        let path = self.manifest(yaml);
        self.ok(&["delete", "-f", &path]).await
    }

    fn manifest(&self, yaml: &str) -> String {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.dir
            .write(&format!("m{n}.yaml"), yaml)
            .to_string_lossy()
            .into_owned()
    }

    /// `kubectl describe ingress NAME -n NS`, only the part after `Events:`.
    pub async fn described_events(&self, namespace: &str, name: &str) -> String {
        let described = self
            .ok(&["describe", "ingress", name, "-n", namespace])
            .await;
        described
            .split_once("\nEvents:")
            .map(|(_, e)| e.to_string())
            .unwrap_or_default()
    }

    /// The ADDRESS column of `kubectl get ingress NAME -n NS` (empty when blank).
    pub async fn address(&self, namespace: &str, name: &str) -> String {
        let table = self.ok(&["get", "ingress", name, "-n", namespace]).await;
        column(&table, "ADDRESS")
    }

    /// Waits until the ADDRESS of the Ingress `namespace/name` is `want` (`""` for none).
    pub async fn wait_address(&self, namespace: &str, name: &str, want: &str) {
        eventually(
            &format!("ADDRESS of {namespace}/{name} = {want:?}"),
            TIMEOUT,
            async || {
                let got = self.address(namespace, name).await;
                if got == want { Ok(()) } else { Err(got) }
            },
        )
        .await;
    }

    /// The holder of a Lease, as `kubectl get lease` shows it.
    pub async fn lease_holder(&self, namespace: &str, name: &str) -> String {
        let out = self.kubectl(&["get", "lease", name, "-n", namespace]).await;
        if !out.status.success() {
            return String::new();
        }
        column(&String::from_utf8_lossy(&out.stdout), "HOLDER")
    }

    /// Requests not sent by kubectl (kube-rs sends no User-Agent) that `keep` accepts.
    pub fn controller_requests(&self, keep: impl Fn(&RequestRecord) -> bool) -> Vec<RequestRecord> {
        self.server.requests().matching(|r| {
            !r.user_agent
                .as_deref()
                .is_some_and(|u| u.contains("kubectl"))
                && keep(r)
        })
    }

    /// Requests sent by the instance named `identity` (its pod name, which it puts in its
    /// User-Agent) that `keep` accepts.
    pub fn requests_by(
        &self,
        identity: &str,
        keep: impl Fn(&RequestRecord) -> bool,
    ) -> Vec<RequestRecord> {
        let agent = format!("({identity})");
        self.server
            .requests()
            .matching(|r| r.user_agent.as_deref().is_some_and(|u| u.contains(&agent)) && keep(r))
    }
}

/// The cell under `header` in the first row of a `kubectl get` table, found by the header's
/// position (cells may be blank, so splitting on whitespace would not do).
pub fn column(table: &str, header: &str) -> String {
    let mut lines = table.lines();
    let head = lines.next().unwrap_or_default();
    let row = lines.next().unwrap_or_default();
    let Some(start) = head.find(header) else {
        return String::new();
    };
    let end = head[start + header.len()..]
        .find(|c: char| !c.is_whitespace())
        .map_or(row.len(), |i| start + header.len() + i);
    row.get(start..end.min(row.len()))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Status writes (`PUT …/ingresses/NAME/status`) sent by the instance named `identity`.
pub fn status_writes(cluster: &Cluster, identity: &str) -> Vec<RequestRecord> {
    cluster.requests_by(identity, |r| {
        r.method == "PUT" && r.path.contains("/ingresses/") && r.path.ends_with("/status")
    })
}

/// Polls `check` every 20 ms until it holds; panics with `what` (and its last answer) after
/// `timeout`.
pub async fn eventually<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => {
                assert!(
                    Instant::now() < deadline,
                    "timed out after {timeout:?} waiting for {what}; last: {last}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The admin endpoint's status without blocking the runtime.
pub async fn admin_get(ingress: &Ingress, path: &str) -> (u16, String) {
    let addr = ingress.admin;
    let path = path.to_string();
    tokio::task::spawn_blocking(move || client::blocking_get(addr, &path, "localhost"))
        .await
        .expect("admin request task")
}

pub async fn metric(ingress: &Ingress, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    client::metric_value(&admin_get(ingress, "/metrics").await.1, name, labels)
}

pub async fn wait_ready(ingress: &Ingress) {
    eventually("/readyz 200", TIMEOUT, async || {
        match admin_get(ingress, "/readyz").await {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}\nlogs:\n{}", tail(&ingress.logs()))),
        }
    })
    .await;
}

pub async fn is_leader(ingress: &Ingress) -> bool {
    metric(ingress, "ingress_leader", &[]).await == Some(1.0)
}

/// Waits until `ingress` holds the Lease (`leading`) or says it does not (`!leading`: the
/// gauge at 0, not merely absent).
pub async fn wait_leading(ingress: &Ingress, leading: bool) {
    let (what, want) = if leading {
        ("leading", 1.0)
    } else {
        ("not leading", 0.0)
    };
    eventually(what, TIMEOUT, async || {
        match metric(ingress, "ingress_leader", &[]).await {
            Some(gauge) if gauge == want => Ok(()),
            other => Err(format!(
                "ingress_leader {other:?}\n{}",
                tail(&ingress.logs())
            )),
        }
    })
    .await;
}

/// The last lines of a log, for failure messages.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Which backend answers `host` at `path` now: its name, `<status>` for a proxy answer, or
/// `<error: …>`.
pub async fn who(http: &HttpClient, ingress: &Ingress, host: &str, path: &str) -> String {
    match client::try_get(http, &ingress.url(path), host).await {
        Ok(reply) => reply.backend(),
        Err(e) => format!("<error: {e}>"),
    }
}

/// Waits until `host` is answered by `backend` (a name, or `<status>` as [`who`] says it),
/// returning how long that took.
pub async fn wait_routed(
    http: &HttpClient,
    ingress: &Ingress,
    host: &str,
    backend: &str,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    eventually(
        &format!("{host} routed to {backend}"),
        timeout,
        async || {
            let got = who(http, ingress, host, "/").await;
            if got == backend { Ok(()) } else { Err(got) }
        },
    )
    .await;
    started.elapsed()
}

/// One answer seen by [`Traffic`].
#[derive(Clone, Debug)]
pub struct Answer {
    pub at: Instant,
    /// The backend's name, or `<status>`, or `<error: …>`.
    pub backend: String,
}

/// Requests in a loop on one keep-alive client until stopped, recording every answer. Bounded:
/// it stops by itself after `limit`.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    pub fn start(ingress: &Ingress, host: &str, limit: Duration) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let url = ingress.url("/");
        let host = host.to_string();
        let (task_stop, task_answers) = (stop.clone(), answers.clone());
        let task = tokio::spawn(async move {
            let http = client::http1();
            let started = Instant::now();
            while !task_stop.load(Ordering::Relaxed) && started.elapsed() < limit {
                let backend = match client::try_get(&http, &url, &host).await {
                    Ok(reply) => reply.backend(),
                    Err(e) => format!("<error: {e}>"),
                };
                task_answers.lock().unwrap().push(Answer {
                    at: Instant::now(),
                    backend,
                });
                // About 200 requests a second: dense enough to catch a gap of a few ms in
                // routing, light enough for two shared CPUs.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Traffic {
            stop,
            answers,
            task,
        }
    }

    pub fn count(&self) -> usize {
        self.answers.lock().unwrap().len()
    }

    /// Waits until at least `n` more answers arrived than now.
    pub async fn wait_more(&self, n: usize) {
        let target = self.count() + n;
        eventually(&format!("{n} more answers"), TIMEOUT, async || {
            if self.count() >= target {
                Ok(())
            } else {
                Err(self.count().to_string())
            }
        })
        .await;
    }

    pub async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("traffic task");
        Arc::try_unwrap(self.answers)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|a| a.lock().unwrap().clone())
    }
}

/// Asserts that every answer came from one of `allowed` backends; else panics with `what` and
/// a count of each other answer.
pub fn assert_answered_by(answers: &[Answer], allowed: &[&str], what: &str) {
    let others = unexpected(answers, allowed);
    assert!(others.is_empty(), "{what}: {others:?}");
}

/// Answers that were not from one of `allowed` backends, with a count per kind.
fn unexpected(answers: &[Answer], allowed: &[&str]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for a in answers
        .iter()
        .filter(|a| !allowed.contains(&a.backend.as_str()))
    {
        match out.iter_mut().find(|(b, _)| *b == a.backend) {
            Some((_, n)) => *n += 1,
            None => out.push((a.backend.clone(), 1)),
        }
    }
    out
}
