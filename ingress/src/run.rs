//! Wiring for `ingress` (the default command): sources → pipeline → published snapshot →
//! proxy listeners, admin listener; then SIGTERM → not ready → stop accepting → drain.
//!
//! The proxy's listeners open only once a snapshot built from fully synced sources is
//! published: until then a known host would be answered 404 over HTTP and reset over HTTPS, and
//! a hostNetwork DaemonSet gets traffic the moment its ports open. Before that a client finds
//! the ports closed. The admin port opens at once (liveness, and readiness saying why not).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, AdminMetrics, Health};
use crate::cli::{Mode, PolicyArgs, RunArgs, SourceArgs, TlsArgs};
use crate::gate::{Gate, GateOptions};
use crate::mapsync::MapSync;
use crate::proxy::caps::ConnectionCaps;
use crate::proxy::listener::{HttpSettings, Listener, Plain, Serving, defer_accept};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::tls::accept::TlsHandshake;
use crate::proxy::tls::resolver;
use crate::proxy::{Proxy, ProxySettings};
use crate::publish::{Pipeline, PipelineMetrics, Published};
use crate::report;
use crate::snapshot::BuildSettings;
use crate::snapshot::address::{self, AddressPolicy};
use crate::snapshot::backend::BackendPolicy;
use crate::snapshot::certs;
use crate::snapshot::class::ClassSelector;
use crate::snapshot::tls::TlsSettings;
use crate::source::watch;
use crate::store::ObjectKey;
use crate::telemetry::Telemetry;
use crate::telemetry::logging::Logging;
use ingress_wire::target::PathSettings;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error(transparent)]
    Kube(#[from] crate::source::kube::KubeError),
    #[error("--mode ebpf: the kernel gate did not load: {0}")]
    Gate(crate::gate::GateError),
    #[error("{flag}: {why}")]
    Flags {
        flag: &'static str,
        why: &'static str,
    },
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Otel(#[from] crate::telemetry::otel::OtelError),
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
    #[error("--default-certificate {0:?}: expected NAMESPACE/NAME")]
    DefaultCertificate(String),
    #[error(transparent)]
    Certificate(#[from] crate::snapshot::certs::CertError),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Whether this binary carries its kernel programs (set by build.rs).
pub fn ebpf_object_embedded() -> bool {
    cfg!(ebpf_embedded)
}

pub async fn run(args: RunArgs, logging: &Logging) -> Result<(), RunError> {
    check_flags(&args)?;
    if ebpf_object_embedded() {
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            "starting; eBPF object embedded"
        );
    } else {
        tracing::warn!(
            version = env!("CARGO_PKG_VERSION"),
            "starting; this is a userspace-only build (no eBPF object embedded: build with `cargo xtask build`)"
        );
    }
    // Until the first snapshot is served, freed memory goes back to the system at once: loading
    // the gate (the kernel's BTF) and listing a large cluster (its JSON pages) free tens of MiB
    // that the allocator would otherwise keep for later, on threads that may never allocate
    // again.
    set_purge_delay_ms(0);
    let gate = load_gate(&args)?;
    release_freed_memory();
    let published = Published::new();
    // Every subsystem registers its metrics before the registry is shared with /metrics.
    let mut telemetry = Telemetry::new(ebpf_object_embedded(), published.clone());
    telemetry.ebpf_enabled.set(i64::from(gate.is_some()));
    let registry = telemetry.registry_mut();
    let admin_metrics = AdminMetrics::register(registry);
    let pipeline_metrics = PipelineMetrics::register(registry);
    let controller = compat_controller(&args);
    let compat = args.log.metrics_compat.map(|_| {
        crate::proxy::metrics::compat::CompatMetrics::register(
            telemetry.compat_registry_mut(),
            controller.clone(),
            args.log.metrics_per_host,
        )
    });
    let registry = telemetry.registry_mut();
    let proxy_metrics = ProxyMetrics::register(registry, gate.as_ref(), compat);
    let sync_errors = crate::mapsync::register_metrics(registry, gate.as_ref());
    let watch_metrics = crate::source::kube::WatchMetrics::register(registry);
    let report_metrics = report::ReportMetrics::register(registry);
    if args.log.metrics_compat.is_some() {
        let collector = crate::telemetry::compat::CompatController {
            controller,
            published: published.clone(),
            proxy: proxy_metrics.clone(),
            publishes: pipeline_metrics.publishes.clone(),
            last_publish: pipeline_metrics.last_publish.clone(),
        };
        telemetry
            .compat_registry_mut()
            .register_collector(Box::new(collector));
    }
    let telemetry = Arc::new(telemetry);
    let health = Arc::new(Health::default());
    let stop = CancellationToken::new();

    let admin_addr = SocketAddr::new(args.listen.admin_bind, args.listen.admin_port);
    let admin_listener = bind("admin", admin_addr).await?;
    let admin = Arc::new(Admin::new(
        published.clone(),
        telemetry,
        admin_metrics,
        health.clone(),
        args.listen.admin_remote_access.into(),
    ));
    tokio::spawn(admin.serve(admin_listener, stop.clone()));

    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let pipeline = Pipeline {
        settings: build_settings(
            &args.source,
            &args.tls,
            &args.policy,
            args.global_settings(),
        )?,
        published: published.clone(),
        metrics: pipeline_metrics,
        debounce: args.proxy.debounce,
        max_delay: args.proxy.debounce * 5,
        refresh: CERTIFICATE_REFRESH,
    };
    if let Some(gate) = &gate {
        let sync = MapSync::new(gate.clone(), sync_errors);
        published.add_hook(Arc::new(sync));
    }
    published.add_hook(proxy_metrics.route_table());
    pipeline.spawn(events_rx).map_err(RunError::Thread)?;
    let _dir_watch = match &args.source.manifests {
        Some(dir) => Some(watch::start(dir, events_tx)?),
        None => {
            start_kube(
                &args,
                events_tx,
                published.clone(),
                watch_metrics,
                report_metrics,
            )
            .await?;
            None
        }
    };

    // Kept for the life of the process: dropping it flushes the spans still batched.
    let otel = args
        .log
        .otel()
        .map(|settings| crate::telemetry::otel::start(&settings))
        .transpose()?;
    let (_otel, tracing) = match otel {
        Some((provider, tracing)) => (Some(provider), Some(Arc::new(tracing))),
        None => (None, None),
    };
    let proxy = Arc::new(
        Proxy::new(
            published.clone(),
            proxy_metrics.clone(),
            ProxySettings {
                client_body_timeout: args.limits.client_body_timeout,
                client_send_timeout: args.limits.client_send_timeout,
                access_log: logging.access,
                access_format: args.log.access_format(),
                log_lines: Some(logging.lines.clone()),
                https_port: args.listen.https_port,
                paths: PathSettings {
                    escaped_slashes: args.requests.escaped_slashes.into(),
                    merge_slashes: args.requests.merge_slashes,
                },
                no_sni_requests: args.tls.no_sni_requests.into(),
            },
        )
        .with_tracing(tracing),
    );
    let serving = Arc::new(Serving::new(
        proxy.clone(),
        HttpSettings {
            header_read_timeout: args.proxy.header_read_timeout,
            max_header_size: args.proxy.max_header_size,
            keepalive_timeout: args.limits.client_keepalive_timeout,
            http2_ping_interval: args.limits.http2_ping_interval,
            http2_ping_timeout: args.limits.http2_ping_timeout,
        },
    ));
    let caps = ConnectionCaps::new(
        args.limits.max_connections,
        args.limits.max_connections_per_client,
    );
    tokio::select! {
        () = published.synced() => {
            // From here on, freed memory is reused by the traffic; returning it at once would
            // cost a system call each time a page empties.
            set_purge_delay_ms(MIMALLOC_PURGE_DELAY_MS);
            release_freed_memory();
        }
        signal = wait_for_shutdown_signal() => {
            signal?;
            tracing::info!("stopping before the first snapshot was published");
            return Ok(());
        }
    }
    let proxy_header_timeout = args.listen.proxy_protocol_header_timeout;
    let http_addr = SocketAddr::new(args.listen.bind, args.listen.http_port);
    let http = Listener {
        name: "http",
        listener: bind("http", http_addr).await?,
        handshake: Arc::new(Plain),
        https: false,
        caps: caps.clone(),
        proxy_header_timeout,
    };
    let https_addr = SocketAddr::new(args.listen.bind, args.listen.https_port);
    // The gate judges only connections of the listener it was given, marked before listen()
    // so none reaches the queue unmarked.
    let https_listener = bind_with("https", https_addr, |socket| match &gate {
        Some(gate) => gate.register_listener(socket).map_err(RunError::Gate),
        None => Ok(()),
    })
    .await?;
    // TLS clients speak first, so nothing is lost by holding a connection back until its first
    // bytes arrive (nginx's `listen ... deferred`): by then the kernel gate has decided, and a
    // client that connects and says nothing costs no task until the handshake timeout.
    if let Err(err) = defer_accept(&https_listener, args.tls.tls_handshake_timeout) {
        tracing::warn!(%err, "TCP_DEFER_ACCEPT unavailable on the HTTPS listener");
    }
    let https = Listener {
        name: "https",
        listener: https_listener,
        handshake: Arc::new(TlsHandshake {
            configs: Arc::new(resolver::ServerConfigs::new(published.clone())?),
            published: published.clone(),
            handshake_timeout: args.tls.tls_handshake_timeout,
            metrics: proxy_metrics.clone(),
            gate: gate.clone(),
            passthrough: crate::proxy::passthrough::PassthroughSettings {
                connect_timeout: args.proxy.upstream_connect_timeout,
                idle_timeout: args.proxy.passthrough_idle_timeout,
            },
        }),
        https: true,
        caps,
        proxy_header_timeout,
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http.run(
        serving.clone(),
        proxy_metrics.clone(),
        stop.clone(),
        args.proxy.drain_timeout,
    ));
    tasks.spawn(https.run(
        serving.clone(),
        proxy_metrics.clone(),
        stop.clone(),
        args.proxy.drain_timeout,
    ));
    health.set_listening();
    tracing::info!(http = %http_addr, https = %https_addr, admin = %admin_addr, "listening");

    wait_for_shutdown_signal().await?;
    tracing::info!(drain_timeout = ?args.proxy.drain_timeout, "shutting down: readiness off, draining");
    health.set_draining();
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    published.clear_hooks();
    if let Some(gate) = gate {
        // Detaching happens when the last holder drops it; the listeners are gone by now.
        match Arc::try_unwrap(gate) {
            Ok(gate) => {
                drop(gate);
                tracing::info!("kernel gate detached");
            }
            Err(_) => tracing::warn!(
                "kernel gate still referenced at exit; the kernel detaches it with the process"
            ),
        }
    }
    tracing::info!("drained; exiting");
    Ok(())
}

/// Flag combinations that can never take effect: without `--configmap` nothing can turn the
/// setting they refine on later, so they are a mistake worth stopping for.
pub fn check_flags(args: &RunArgs) -> Result<(), RunError> {
    if args.source.configmap.is_some() {
        return Ok(());
    }
    let identity = &args.identity;
    if !identity.use_forwarded_headers {
        // With PROXY protocol it says whose header is believed.
        if identity.proxy_real_ip_cidr.is_some() && !args.listen.use_proxy_protocol {
            return Err(RunError::Flags {
                flag: "--proxy-real-ip-cidr",
                why: "has no effect without --use-forwarded-headers or --use-proxy-protocol (or a --configmap that sets use-forwarded-headers)",
            });
        }
        if identity.forwarded_for_header != "x-forwarded-for" {
            return Err(RunError::Flags {
                flag: "--forwarded-for-header",
                why: "has no effect without --use-forwarded-headers (or a --configmap that sets use-forwarded-headers)",
            });
        }
    }
    if !args.tls.hsts && (args.tls.hsts_include_subdomains || args.tls.hsts_preload) {
        return Err(RunError::Flags {
            flag: if args.tls.hsts_preload {
                "--hsts-preload"
            } else {
                "--hsts-include-subdomains"
            },
            why: "has no effect with --hsts=false (or without a --configmap that sets hsts)",
        });
    }
    Ok(())
}

/// Watches the Kubernetes API and reports back to it (status, Events) while holding the Lease.
async fn start_kube(
    args: &RunArgs,
    events: mpsc::UnboundedSender<crate::store::SourceEvent>,
    published: Arc<Published>,
    watch_metrics: Arc<crate::source::kube::WatchMetrics>,
    report_metrics: Arc<report::ReportMetrics>,
) -> Result<(), RunError> {
    // Two processes on one host must not share an identity, or both would think they hold the
    // Lease: without a pod name, the host name gets a random suffix (as client-go does).
    let identity = args
        .kube
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("{}_{:08x}", hostname(), fastrand::u32(..)));
    let client = crate::source::kube::client(args.source.kubeconfig.as_deref(), &identity).await?;
    tracing::info!(namespace = args.kube.watch_namespace.as_deref().unwrap_or("(all)"), %identity, "watching the Kubernetes API");
    crate::source::kube::KubeSource {
        client: client.clone(),
        namespace: args.kube.watch_namespace.clone(),
        metrics: watch_metrics,
        config_map: args.source.configmap.clone(),
    }
    .start(events);
    let kube_args = args.kube.clone();
    let lease = report::leader::LeaseSettings::new(
        &kube_args.lease_name,
        &kube_args.lease_namespace,
        kube_args.lease_duration,
    );
    tokio::spawn(async move {
        let source = if kube_args.update_status {
            report::address::AddressSource::choose(
                kube_args.publish_address.as_deref(),
                kube_args.publish_service.as_ref(),
                kube_args.node_name.as_deref(),
            )
        } else {
            tracing::info!("--update-status=false: Ingress status is left to someone else");
            report::address::AddressSource::Fixed(Vec::new())
        };
        let addresses = source.follow(client.clone());
        report::Reporter {
            client,
            published,
            metrics: report_metrics,
            lease,
            addresses,
            identity,
        }
        .run()
        .await;
    });
    Ok(())
}

/// ingress-nginx's constant labels, for `--metrics-compat`: this pod's namespace and name (the
/// downward API's, else the host name) and the IngressClass controller it serves.
fn compat_controller(args: &RunArgs) -> crate::proxy::metrics::compat::Controller {
    crate::proxy::metrics::compat::Controller {
        namespace: args.kube.lease_namespace.as_str().into(),
        class: args.source.controller_class.as_str().into(),
        pod: args.kube.pod_name.clone().unwrap_or_else(hostname).into(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ingress".into())
}

/// Loading the gate parses the kernel's BTF (tens of MiB, freed once the programs are loaded);
/// the allocator keeps freed pages for reuse unless told to return them, and an idle proxy
/// never would reuse them.
fn release_freed_memory() {
    // SAFETY: mi_collect only walks and purges the allocator's own free pages. It is harmless
    // (and has nothing to do) when mimalloc is not the global allocator, as in unit tests.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// mimalloc's `mi_option_purge_delay`: how long an emptied page is kept before it goes back to
/// the system. libmimalloc-sys names the options around it (`eager_commit_delay` is 14,
/// `use_numa_nodes` 16) but not this one.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// Once traffic flows: a second, the default of the mimalloc generation we link (v3; v2's was
/// 10 ms). HTTP/2 streams free and reallocate whole pages, and with 10 ms those pages went back
/// to the system between bursts and were faulted in again: about 23,000 page faults a second
/// under h2load over TLS (64 connections × 10 streams) and some 6% of the proxy's CPU, against
/// about 1,300 with a second. HTTP/1.1 takes none either way.
const MIMALLOC_PURGE_DELAY_MS: std::ffi::c_long = 1000;

fn set_purge_delay_ms(ms: std::ffi::c_long) {
    // SAFETY: setting an option only stores a value mimalloc reads when it next purges. Like
    // `mi_collect`, it is harmless when mimalloc is not the global allocator.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms) };
}

/// `--mode`: load the kernel gate, or explain in one line why userspace mode is used.
fn load_gate(args: &RunArgs) -> Result<Option<Arc<Gate>>, RunError> {
    if args.kernel.mode == Mode::Userspace {
        tracing::info!("userspace mode (--mode userspace): the SNI gate runs after accept");
        return Ok(None);
    }
    let options = GateOptions {
        pin_dir: args.kernel.bpf_pin_dir.clone(),
        cgroup: args.kernel.bpf_cgroup.clone(),
        https_ports: vec![args.listen.https_port],
        // The pinned policy stays as the previous run left it until the first snapshot from
        // synced sources is published (nothing is gated before the listener is registered).
        policy: None,
        verdict_timeout: args.kernel.gate_timeout,
        early_reset: args.kernel.gate_interfaces.clone(),
        // The programs skip the header to reach the ClientHello.
        proxy_protocol: args.listen.use_proxy_protocol,
        ..GateOptions::default()
    };
    match Gate::load(options) {
        Ok(gate) => {
            tracing::info!(pin_dir = %gate.pin_dir().display(), port = args.listen.https_port, "eBPF mode: the kernel SNI gate is loaded");
            Ok(Some(Arc::new(gate)))
        }
        Err(err) if args.kernel.mode == Mode::Ebpf => Err(RunError::Gate(err)),
        Err(err) => {
            tracing::warn!(reason = %err, "eBPF gate unavailable; falling back to userspace mode (same SNI policy, applied after accept)");
            Ok(None)
        }
    }
}

/// Certificates are re-judged for expiry at least this often.
const CERTIFICATE_REFRESH: std::time::Duration = std::time::Duration::from_secs(600);

/// The snapshot builder's settings from flags. Shared by `run` and `check`.
pub fn build_settings(
    source: &SourceArgs,
    tls: &TlsArgs,
    policy: &PolicyArgs,
    global: crate::snapshot::global::GlobalSettings,
) -> Result<BuildSettings, RunError> {
    let default_certificate = match &tls.default_certificate {
        None => None,
        Some(value) => match value.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Some(ObjectKey::new(ns, name))
            }
            _ => return Err(RunError::DefaultCertificate(value.clone())),
        },
    };
    Ok(BuildSettings {
        class: ClassSelector {
            ingress_class: source.ingress_class.clone(),
            controller_class: source.controller_class.clone(),
        },
        tls: TlsSettings {
            default_certificate,
            self_signed: Arc::new(certs::self_signed()?),
            now: crate::clock::unix_now(),
        },
        backends: backend_policy(source, policy),
        unsupported_access: policy.unsupported_access_annotations.into(),
        unnamed: tls.unnamed_policy(),
        global,
        config_map: source.configmap.clone(),
    })
}

/// The backend rules, with this host's interface addresses as they are at startup.
fn backend_policy(source: &SourceArgs, policy: &PolicyArgs) -> BackendPolicy {
    let allow_local = policy.allow_local_backends(source);
    let host_addresses = if allow_local {
        Vec::new()
    } else {
        address::host_addresses().unwrap_or_else(|err| {
            tracing::warn!(%err, "cannot list this host's addresses; only loopback, link-local and unspecified backend addresses are refused");
            Vec::new()
        })
    };
    tracing::info!(
        allow_local_backends = allow_local,
        allow_external_name_services = policy.allow_external_name_services,
        host_addresses = host_addresses.len(),
        "backend address policy"
    );
    BackendPolicy {
        allow_external_name: policy.allow_external_name_services,
        addresses: AddressPolicy {
            allow_local,
            ..AddressPolicy::refusing_local(host_addresses)
        },
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, RunError> {
    bind_with(what, addr, |_| Ok(())).await
}

/// `bind`, running `prepare` on the bound socket before it listens.
async fn bind_with(
    what: &'static str,
    addr: SocketAddr,
    prepare: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> Result<(), RunError>,
) -> Result<TcpListener, RunError> {
    // A restarted pod may find its previous sockets in TIME_WAIT; SO_REUSEADDR lets it bind.
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(|source| RunError::Bind { what, addr, source })?;
    socket
        .set_reuseaddr(true)
        .map_err(|source| RunError::Bind { what, addr, source })?;
    socket
        .bind(addr)
        .map_err(|source| RunError::Bind { what, addr, source })?;
    prepare(std::os::fd::AsFd::as_fd(&socket))?;
    socket
        .listen(4096)
        .map_err(|source| RunError::Bind { what, addr, source })
}

async fn wait_for_shutdown_signal() -> Result<(), RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunError::Signal)?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
