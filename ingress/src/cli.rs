//! Every flag, in one place. Each has an environment twin so a DaemonSet can configure the
//! controller without rewriting its command line.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::gate::EarlyReset;
use crate::object::ObjectKey;
use crate::snapshot::sni::UnnamedPolicy;

/// A flag's values, as clap reads them, mirroring a domain enum that knows nothing of clap;
/// the flag's value converts into it where the flags are read. Variant docs are the help text.
macro_rules! flag_values {
    ($(#[$meta:meta])* $name:ident => $domain:ty { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl From<$name> for $domain {
            fn from(value: $name) -> Self {
                match value {
                    $($name::$variant => <$domain>::$variant),+
                }
            }
        }
    };
}

flag_values! {
    /// `--no-sni`, `--malformed-tls`, `--not-tls`.
    Admit => crate::snapshot::sni::Admit {
        Accept,
        Reject,
    }
}

flag_values! {
    /// `--no-sni-requests`.
    NoSniRequests => crate::proxy::phase::tls::NoSniRequests {
        /// Its requests may only name hosts served with the default certificate (others get 421).
        DefaultCertificate,
        /// Its requests are routed by Host alone, as ingress-nginx does.
        Any,
    }
}

flag_values! {
    /// `--unsupported-access-annotations`.
    UnsupportedAccess => crate::snapshot::annotations::UnsupportedAccess {
        /// Not served: every path it declares answers 503, so nothing it protects is public.
        Refuse,
        /// Served without that protection, with a warning.
        Ignore,
    }
}

flag_values! {
    /// `--admin-remote-access`.
    RemoteAccess => crate::admin::RemoteAccess {
        /// `/healthz` and `/readyz` only.
        Probes,
        /// The probes and `/metrics`.
        Metrics,
        /// Everything, `/routes` included.
        All,
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "ingress",
    version,
    about = "Kubernetes ingress controller with an eBPF SNI gate",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at startup; boxing the flags would only add noise"
)]
pub enum Command {
    /// Print the resolved routing table and every diagnostic; exit 1 if any is an error.
    Check(CheckArgs),
    /// Print the version and whether this binary carries its eBPF programs.
    Version,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub proxy: ProxyArgs,
    #[command(flatten)]
    pub requests: RequestArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub identity: IdentityArgs,
}

/// Trusted forwarded headers: who the client is behind a load balancer that does not speak
/// PROXY protocol. Each is also a ConfigMap key of the same name, which overrides the flag.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Client identity")]
pub struct IdentityArgs {
    /// Believe the client address in --forwarded-for-header and the scheme, host and port in
    /// `X-Forwarded-Proto`, `-Host` and `-Port`, when the connecting peer is trusted
    /// (--proxy-real-ip-cidr). ingress-nginx's `use-forwarded-headers`.
    #[arg(long, env = "INGRESS_USE_FORWARDED_HEADERS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub use_forwarded_headers: bool,
    /// The header that carries the client's address chain (ingress-nginx's
    /// `forwarded-for-header`), such as `X-Forwarded-For` or `CF-Connecting-IP`.
    #[arg(long, env = "INGRESS_FORWARDED_FOR_HEADER", default_value = "X-Forwarded-For", value_parser = forwarded_for_header, value_name = "NAME")]
    pub forwarded_for_header: http::HeaderName,
    /// Send upstream the incoming `X-Forwarded-For` list with the peer appended, rather than
    /// the client address alone (ingress-nginx's `compute-full-forwarded-for`).
    #[arg(long, env = "INGRESS_COMPUTE_FULL_FORWARDED_FOR", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub compute_full_forwarded_for: bool,
    /// The proxies whose forwarded headers are believed, as addresses and CIDR ranges,
    /// comma-separated: the peer must be one, and the address chain is walked from the right
    /// past every hop that is one (nginx's `real_ip_recursive on`). Default: the connecting
    /// peer only, so only the address it appended is believed (ingress-nginx's default,
    /// `0.0.0.0/0`, believes every hop, which any client can write).
    #[arg(long, env = "INGRESS_PROXY_REAL_IP_CIDR", value_parser = source_ranges, value_name = "CIDR[,CIDR...]")]
    pub proxy_real_ip_cidr: Option<SourceRanges>,
}

impl IdentityArgs {
    pub fn forwarded(&self) -> crate::snapshot::global::ForwardedPolicy {
        crate::snapshot::global::ForwardedPolicy {
            enabled: self.use_forwarded_headers,
            header: self.forwarded_for_header.clone(),
            compute_full: self.compute_full_forwarded_for,
            trusted: self.proxy_real_ip_cidr.clone(),
        }
    }
}

fn forwarded_for_header(s: &str) -> Result<http::HeaderName, String> {
    crate::snapshot::global::forwarded_for_header(s).map_err(|why| format!("{s:?} {why}"))
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Kernel gate")]
pub struct KernelArgs {
    /// `ebpf`: the kernel gate must load (startup fails with the reason otherwise);
    /// `userspace`: never load it; `auto`: try, and fall back to userspace with one log line.
    #[arg(long, env = "INGRESS_MODE", value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
    /// Where the gate's maps are pinned (on a bpffs; mounted there if missing and root).
    #[arg(
        long,
        env = "INGRESS_BPF_PIN_DIR",
        default_value = "/sys/fs/bpf/ingress",
        value_name = "DIR"
    )]
    pub bpf_pin_dir: PathBuf,
    /// The cgroup v2 directory the sock_ops program attaches to. Default: the cgroup this
    /// process runs in (its listeners' connections are the ones gated).
    #[arg(long, env = "INGRESS_BPF_CGROUP", value_name = "DIR")]
    pub bpf_cgroup: Option<PathBuf>,
    /// How long a new HTTPS connection may take to deliver its first TLS record to the kernel
    /// gate before it is closed.
    #[arg(long, env = "INGRESS_GATE_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub gate_timeout: Duration,
    /// Where the kernel resets an unknown name before the connection is ever accepted (a TC
    /// ingress program): `all` Ethernet and loopback interfaces, including ones that appear
    /// later; `none`; or a comma-separated list of interface names. Connections it does not
    /// see are still gated, after accept.
    #[arg(
        long,
        env = "INGRESS_GATE_INTERFACES",
        default_value = "all",
        value_parser = early_reset,
        value_name = "all|none|IF,..."
    )]
    pub gate_interfaces: EarlyReset,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Ebpf,
    Userspace,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Kubernetes")]
pub struct KubeArgs {
    /// Watch only this namespace (IngressClasses are cluster-scoped and always watched).
    #[arg(long, env = "INGRESS_WATCH_NAMESPACE", value_name = "NS")]
    pub watch_namespace: Option<String>,
    /// The addresses written into Ingress status, comma-separated (IPs or host names);
    /// ingress-nginx's `--publish-status-address` is accepted as another name for it. Default:
    /// the addresses of --publish-service, else the ExternalIP, else InternalIP, of the node
    /// named by --node-name.
    #[arg(
        long,
        alias = "publish-status-address",
        env = "INGRESS_PUBLISH_ADDRESS",
        value_name = "ADDR[,ADDR...]"
    )]
    pub publish_address: Option<String>,
    /// The Service (NAMESPACE/NAME) whose addresses are written into Ingress status, followed as
    /// they change: a LoadBalancer's status addresses and external IPs, a NodePort's external
    /// IPs, a ClusterIP's cluster IP, an ExternalName's name.
    #[arg(long, env = "INGRESS_PUBLISH_SERVICE", value_name = "NAMESPACE/NAME", value_parser = namespaced_name)]
    pub publish_service: Option<ObjectKey>,
    /// Write Ingress status at all. `--update-status=false` leaves it to someone else, so two
    /// controllers serving one class do not take turns overwriting it (and make ExternalDNS
    /// flap); Events are still written.
    #[arg(
        long,
        env = "INGRESS_UPDATE_STATUS",
        default_value_t = true,
        action = ArgAction::Set,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub update_status: bool,
    /// This pod's node (from the downward API), for the status address.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// This instance's name in the Lease and in Events. Default: the host name.
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,
    /// The Lease whose holder writes Ingress status and Events.
    #[arg(
        long,
        env = "INGRESS_LEASE_NAME",
        default_value = "ingress-controller-leader",
        value_name = "NAME"
    )]
    pub lease_name: String,
    /// The namespace of that Lease (the pod's own, from the downward API).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "default",
        value_name = "NS"
    )]
    pub lease_namespace: String,
    /// How long a Lease claim lasts without renewal.
    #[arg(long, env = "INGRESS_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// The Secret (NAMESPACE/NAME, type kubernetes.io/tls) served when no Ingress certificate
    /// matches the SNI. Without it a self-signed certificate is generated at startup.
    #[arg(
        long,
        env = "INGRESS_DEFAULT_CERTIFICATE",
        value_name = "NAMESPACE/NAME"
    )]
    pub default_certificate: Option<String>,
    /// Add `Strict-Transport-Security` to HTTPS responses that lack it (on, as in
    /// ingress-nginx).
    #[arg(long, env = "INGRESS_HSTS", default_value_t = true, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub hsts: bool,
    /// HSTS max-age, in seconds.
    #[arg(
        long,
        env = "INGRESS_HSTS_MAX_AGE",
        default_value_t = 31_536_000,
        value_name = "SECONDS"
    )]
    pub hsts_max_age: u64,
    /// Add `includeSubDomains` to the HSTS header. Off here, unlike ingress-nginx: it pins
    /// every subdomain to HTTPS for max-age, names this controller may not even serve.
    #[arg(long, env = "INGRESS_HSTS_INCLUDE_SUBDOMAINS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub hsts_include_subdomains: bool,
    /// Add `preload` to the HSTS header.
    #[arg(long, env = "INGRESS_HSTS_PRELOAD", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub hsts_preload: bool,
    /// Time a client has to send its ClientHello, and again to finish the handshake.
    #[arg(long, env = "INGRESS_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub tls_handshake_timeout: Duration,
    /// A ClientHello without SNI (clients connecting by IP): accept (default certificate) or
    /// reject (reset).
    #[arg(long, env = "INGRESS_NO_SNI", value_enum, default_value_t = Admit::Accept)]
    pub no_sni: Admit,
    /// A first TLS record that is not a ClientHello that parses: accept (let the TLS stack
    /// answer) or reject (reset).
    #[arg(long, env = "INGRESS_MALFORMED_TLS", value_enum, default_value_t = Admit::Reject)]
    pub malformed_tls: Admit,
    /// Bytes that are not TLS at all (such as plain HTTP) on the HTTPS port: accept or reject.
    #[arg(long, env = "INGRESS_NOT_TLS", value_enum, default_value_t = Admit::Reject)]
    pub not_tls: Admit,
    /// Requests on a TLS connection that sent no SNI: `default-certificate` answers 421 to any
    /// that names a host served with a certificate of its own; `any` routes them by Host alone,
    /// as ingress-nginx does.
    #[arg(long, env = "INGRESS_NO_SNI_REQUESTS", value_enum, default_value_t = NoSniRequests::DefaultCertificate)]
    pub no_sni_requests: NoSniRequests,
}

impl TlsArgs {
    pub fn unnamed_policy(&self) -> UnnamedPolicy {
        UnnamedPolicy {
            no_sni: self.no_sni.into(),
            malformed: self.malformed_tls.into(),
            not_tls: self.not_tls.into(),
        }
    }

    pub fn hsts(&self) -> crate::snapshot::global::Hsts {
        crate::snapshot::global::Hsts {
            enabled: self.hsts,
            max_age: self.hsts_max_age,
            include_subdomains: self.hsts_include_subdomains,
            preload: self.hsts_preload,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Without --manifests: read only this namespace from the cluster.
    #[arg(long, env = "INGRESS_WATCH_NAMESPACE", value_name = "NS")]
    pub watch_namespace: Option<String>,
    /// Output format.
    #[arg(long, env = "INGRESS_CHECK_OUTPUT", value_enum, default_value_t = CheckOutput::Text)]
    pub output: CheckOutput,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutput {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Source")]
pub struct SourceArgs {
    /// Read Ingress, IngressClass, Service, EndpointSlice and Secret manifests (*.yaml, *.yml,
    /// *.json, multi-document) from this directory and follow its changes. Without it, the
    /// Kubernetes API is watched.
    #[arg(long, env = "INGRESS_MANIFESTS", value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// The kubeconfig to use when watching the Kubernetes API. Default: KUBECONFIG, then
    /// ~/.kube/config, then the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The IngressClass name this controller serves (also matched against the legacy
    /// `kubernetes.io/ingress.class` annotation).
    #[arg(
        long,
        env = "INGRESS_CLASS",
        default_value = "ingress",
        value_name = "NAME"
    )]
    pub ingress_class: String,
    /// The `spec.controller` value of the IngressClasses this controller serves.
    #[arg(
        long,
        env = "INGRESS_CONTROLLER_CLASS",
        default_value = "ingress.rs/controller",
        value_name = "NAME"
    )]
    pub controller_class: String,
    /// The ConfigMap (NAMESPACE/NAME) holding ingress-nginx's global settings
    /// (`proxy-body-size`, `hsts`, `use-forwarded-headers`, ...): its keys override these
    /// flags, and annotations override it. Watched live; with --manifests, read from the
    /// directory. Every key is listed in docs/configmap.md.
    #[arg(long, env = "INGRESS_CONFIGMAP", value_parser = namespaced_name, value_name = "NAMESPACE/NAME")]
    pub configmap: Option<ObjectKey>,
}

/// What the configuration may ask for: backends, and annotations this controller cannot honour.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Configuration policy")]
pub struct PolicyArgs {
    /// Route to ExternalName Services. Off by default: an ExternalName lets anyone who can
    /// create a Service and an Ingress send traffic to any name, this node included.
    #[arg(long, env = "INGRESS_ALLOW_EXTERNAL_NAME_SERVICES", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_external_name_services: bool,
    /// Accept backends on loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10),
    /// unspecified (0.0.0.0, ::) and this node's own addresses, from EndpointSlices and resolved
    /// ExternalNames alike. Default: true with --manifests (its backends are usually local),
    /// false when watching Kubernetes.
    #[arg(long, env = "INGRESS_ALLOW_LOCAL_BACKENDS", action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_local_backends: Option<bool>,
    /// An Ingress with an access-control annotation this controller does not support
    /// (whitelist-source-range, auth-*, limit-*, ...): `refuse` answers 503 on every path it
    /// declares; `ignore` serves it without that protection.
    #[arg(long, env = "INGRESS_UNSUPPORTED_ACCESS_ANNOTATIONS", value_enum, default_value_t = UnsupportedAccess::Refuse)]
    pub unsupported_access_annotations: UnsupportedAccess,
    /// The largest request body a route accepts unless its `proxy-body-size` annotation says
    /// otherwise (larger: 413), as nginx sizes are written (`1m`, `512k`, `0` for no limit).
    /// ingress-nginx's default, 1m.
    #[arg(long, env = "INGRESS_PROXY_BODY_SIZE", default_value = "1m", value_parser = body_size, value_name = "SIZE")]
    pub proxy_body_size: u64,
    /// The global default backend (NAMESPACE/NAME, its first port), as ingress-nginx's flag of
    /// the same name: it serves the pages of `custom-http-errors` (the ConfigMap's list, and
    /// an Ingress's list without a `default-backend` annotation). Without it, the backend of
    /// the Ingress that has only a `spec.defaultBackend` serves them. Unmatched hosts still go
    /// to that Ingress's backend (or 404).
    #[arg(long, env = "INGRESS_DEFAULT_BACKEND_SERVICE", value_parser = namespaced_name, value_name = "NAMESPACE/NAME")]
    pub default_backend_service: Option<ObjectKey>,
    /// Read the header actions of `server-snippet` and `configuration-snippet` annotations
    /// (literal add_header, more_set_headers, more_clear_headers, proxy_set_header; nothing
    /// else, and no snippet is ever executed). Off by default, as ingress-nginx's
    /// allow-snippet-annotations since v1.9.
    #[arg(long, env = "INGRESS_ALLOW_SNIPPET_ANNOTATIONS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_snippet_annotations: bool,
    /// Addresses and CIDR ranges, comma-separated, that may reach every route whose Ingress
    /// sets no `allowlist-source-range` of its own (ingress-nginx's global
    /// `whitelist-source-range`); others get 403. Default: everyone.
    #[arg(long, alias = "allowlist-source-range", env = "INGRESS_WHITELIST_SOURCE_RANGE", value_parser = source_ranges, value_name = "CIDR[,CIDR...]")]
    pub whitelist_source_range: Option<SourceRanges>,
    /// Addresses and CIDR ranges, comma-separated, refused (403) on every route whose Ingress
    /// sets no `denylist-source-range` of its own (ingress-nginx's global
    /// `denylist-source-range`).
    #[arg(long, env = "INGRESS_DENYLIST_SOURCE_RANGE", value_parser = source_ranges, value_name = "CIDR[,CIDR...]")]
    pub denylist_source_range: Option<SourceRanges>,
}

/// A list of source ranges from a flag.
pub type SourceRanges = std::sync::Arc<[ipnet::IpNet]>;

fn source_ranges(s: &str) -> Result<SourceRanges, String> {
    crate::snapshot::sources::parse_ranges(s)?
        .ok_or_else(|| "expected at least one address or CIDR range".to_string())
}

impl PolicyArgs {
    /// `--allow-local-backends`, or its default for the source in use.
    pub fn allow_local_backends(&self, source: &SourceArgs) -> bool {
        self.allow_local_backends
            .unwrap_or(source.manifests.is_some())
    }
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Listeners")]
pub struct ListenArgs {
    /// Plain HTTP port.
    #[arg(
        long,
        env = "INGRESS_HTTP_PORT",
        default_value_t = 80,
        value_name = "N"
    )]
    pub http_port: u16,
    /// HTTPS port.
    #[arg(
        long,
        env = "INGRESS_HTTPS_PORT",
        default_value_t = 443,
        value_name = "N"
    )]
    pub https_port: u16,
    /// Address the HTTP and HTTPS listeners bind to.
    #[arg(
        long,
        env = "INGRESS_BIND",
        default_value = "0.0.0.0",
        value_name = "ADDR"
    )]
    pub bind: IpAddr,
    /// Admin port: /healthz, /readyz, /metrics, /routes.
    #[arg(
        long,
        env = "INGRESS_ADMIN_PORT",
        default_value_t = 10254,
        value_name = "N"
    )]
    pub admin_port: u16,
    /// Address the admin listener binds to. On a hostNetwork pod the kubelet probes the node's
    /// address, so the default is every address; `127.0.0.1` keeps it off the network entirely
    /// (then use exec probes and a node-local scraper).
    #[arg(
        long,
        env = "INGRESS_ADMIN_BIND",
        default_value = "0.0.0.0",
        value_name = "ADDR"
    )]
    pub admin_bind: IpAddr,
    /// Which admin paths answer peers other than loopback: `probes` (/healthz, /readyz),
    /// `metrics` (those and /metrics, for Prometheus) or `all` (/routes too, which lists every
    /// host, Service, endpoint and Secret name).
    #[arg(long, env = "INGRESS_ADMIN_REMOTE_ACCESS", value_enum, default_value_t = RemoteAccess::Metrics)]
    pub admin_remote_access: RemoteAccess,
    /// Every connection on the HTTP and HTTPS ports starts with a PROXY protocol header (v1 or
    /// v2) from a load balancer, naming the real client; one without is closed. ingress-nginx's
    /// `use-proxy-protocol`, whose ConfigMap key (with `--configmap`) overrides this flag live,
    /// for new connections. The kernel gate skips the header to judge the ClientHello behind
    /// it, and judges source ranges by the client the header names.
    #[arg(long, env = "INGRESS_USE_PROXY_PROTOCOL", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub use_proxy_protocol: bool,
    /// How long a connection has to send its PROXY protocol header (ingress-nginx's
    /// `proxy-protocol-header-timeout`).
    #[arg(long, env = "INGRESS_PROXY_PROTOCOL_HEADER_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub proxy_protocol_header_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Proxy")]
pub struct ProxyArgs {
    /// Time allowed to open a connection to an upstream endpoint (then 504).
    #[arg(long, env = "INGRESS_UPSTREAM_CONNECT_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub upstream_connect_timeout: Duration,
    /// Time allowed for an upstream to send response headers (then 504), and the longest it may
    /// pause while sending a response body. The `proxy-read-timeout` annotation overrides it per
    /// Ingress.
    #[arg(long, env = "INGRESS_UPSTREAM_RESPONSE_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub upstream_response_timeout: Duration,
    /// Time allowed for a client to send a request's headers, from their first byte; and for
    /// an HTTP/2 connection to start its first request.
    #[arg(long, env = "INGRESS_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub header_read_timeout: Duration,
    /// Largest request head accepted, in bytes (then 431). At least 8192.
    #[arg(long, env = "INGRESS_MAX_HEADER_SIZE", default_value_t = 32 * 1024, value_name = "BYTES")]
    pub max_header_size: usize,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "INGRESS_DRAIN_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub drain_timeout: Duration,
    /// How long configuration changes must pause before a snapshot is built; bursts coalesce
    /// into one build, which happens at most 5 debounce periods after the burst began.
    #[arg(long, env = "INGRESS_DEBOUNCE", default_value = "10ms", value_parser = duration)]
    pub debounce: Duration,
    /// Worker threads for the proxy runtime (0: one per CPU).
    #[arg(
        long,
        env = "INGRESS_WORKER_THREADS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub worker_threads: usize,
    /// A TLS passthrough connection on which no byte moved in either direction for this long
    /// is closed.
    #[arg(long, env = "INGRESS_PASSTHROUGH_IDLE_TIMEOUT", default_value = "1h", value_parser = duration)]
    pub passthrough_idle_timeout: Duration,
    /// Name the version in the `Server` header (`ingress/0.1.0` rather than `ingress`), as
    /// ingress-nginx's `server-tokens`.
    #[arg(long, env = "INGRESS_SERVER_TOKENS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub server_tokens: bool,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Requests")]
pub struct RequestArgs {
    /// An encoded slash or backslash (`%2F`, `%5C`) in a path: `keep` it encoded (and answer
    /// 400 when decoding it would route the request elsewhere), `reject` the request (400), or
    /// `unescape` it to `/` for routing and the upstream alike.
    #[arg(long, env = "INGRESS_ESCAPED_SLASHES", value_enum, default_value_t = EscapedSlashes::Keep)]
    pub escaped_slashes: EscapedSlashes,
    /// Merge repeated slashes in paths (`//` becomes `/`) for routing and the upstream alike.
    #[arg(long, env = "INGRESS_MERGE_SLASHES", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub merge_slashes: bool,
    /// Pass on request headers whose names contain `_` (dropped by default, as nginx does).
    #[arg(long, env = "INGRESS_ENABLE_UNDERSCORES_IN_HEADERS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_underscores_in_headers: bool,
}

flag_values! {
    /// `--escaped-slashes`.
    EscapedSlashes => ingress_wire::target::EscapedSlashes {
        Keep,
        Reject,
        Unescape,
    }
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Client connections held at once, on all listeners together; more are closed on accept
    /// (0: no cap).
    #[arg(
        long,
        env = "INGRESS_MAX_CONNECTIONS",
        default_value_t = 16_384,
        value_name = "N"
    )]
    pub max_connections: usize,
    /// Client connections held at once from one client (an IPv4 address or an IPv6 /64); more
    /// are closed on accept (0: no cap).
    #[arg(
        long,
        env = "INGRESS_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 1024,
        value_name = "N"
    )]
    pub max_connections_per_client: u32,
    /// How long a client connection may wait for its next request.
    #[arg(long, env = "INGRESS_CLIENT_KEEPALIVE_TIMEOUT", default_value = "75s", value_parser = duration)]
    pub client_keepalive_timeout: Duration,
    /// The longest a client may pause while sending a request body (then 408).
    #[arg(long, env = "INGRESS_CLIENT_BODY_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub client_body_timeout: Duration,
    /// The longest a write to a client may stall (then the connection closes).
    #[arg(long, env = "INGRESS_CLIENT_SEND_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub client_send_timeout: Duration,
    /// The longest a write to an upstream may stall (then 502).
    #[arg(long, env = "INGRESS_UPSTREAM_SEND_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub upstream_send_timeout: Duration,
    /// How often an HTTP/2 client connection is sent a PING, to find peers that went away
    /// without closing.
    #[arg(long, env = "INGRESS_HTTP2_PING_INTERVAL", default_value = "30s", value_parser = duration)]
    pub http2_ping_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    #[arg(long, env = "INGRESS_HTTP2_PING_TIMEOUT", default_value = "20s", value_parser = duration)]
    pub http2_ping_timeout: Duration,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "INGRESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info,ingress::proxy=debug`).
    #[arg(
        long,
        env = "INGRESS_LOG",
        default_value = "info",
        value_name = "FILTER"
    )]
    pub log_level: String,
    /// One access-log line per request (target `access`).
    #[arg(long, env = "INGRESS_ACCESS_LOG", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub access_log: bool,
    /// How access-log lines are written: `text` or `json` (an event with named fields), or
    /// `upstream` (ingress-nginx's default `log-format-upstream` line, byte for byte).
    /// Default: the `--log-format`.
    #[arg(long, env = "INGRESS_ACCESS_LOG_FORMAT", value_enum)]
    pub access_log_format: Option<AccessLogFormat>,
    /// Also export the request and controller metrics under another controller's names, so its
    /// dashboards and alerts work unchanged: `ingress-nginx` (`nginx_ingress_controller_*`).
    #[arg(long, env = "INGRESS_METRICS_COMPAT", value_enum, value_name = "SET")]
    pub metrics_compat: Option<MetricsCompat>,
    /// With `--metrics-compat`, label request metrics with the request's host (one series per
    /// host per route: set it only where the hosts are few).
    #[arg(long, env = "INGRESS_METRICS_PER_HOST", default_value_t = false, action = ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub metrics_per_host: bool,
    /// Trace requests with OpenTelemetry, sending spans over OTLP/HTTP (protobuf) to this URL
    /// (e.g. `http://otel-collector:4318/v1/traces`). Off when unset: nothing is traced, and
    /// `traceparent` passes through untouched.
    #[arg(long, env = "INGRESS_OTLP_ENDPOINT", value_name = "URL", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the spans.
    #[arg(
        long,
        env = "INGRESS_OTEL_SERVICE_NAME",
        default_value = "ingress",
        value_name = "NAME"
    )]
    pub otel_service_name: String,
    /// The share of new traces sampled, 0 to 1 (ingress-nginx's `otel-sampler-ratio`).
    #[arg(long, env = "INGRESS_OTEL_SAMPLER_RATIO", default_value_t = 0.01, value_name = "RATIO", value_parser = sampler_ratio)]
    pub otel_sampler_ratio: f64,
    /// Follow the caller's sampling decision when a request carries `traceparent`.
    #[arg(long, env = "INGRESS_OTEL_SAMPLER_PARENT_BASED", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub otel_sampler_parent_based: bool,
}

/// `--otlp-endpoint`: an `http://` or `https://` URL.
fn otlp_endpoint(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(s.to_string()),
        _ => Err("expected an http:// or https:// URL with a host".into()),
    }
}

/// `--otel-sampler-ratio`: 0 to 1.
fn sampler_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("expected a number from 0 to 1".into()),
    }
}

/// `--metrics-compat`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsCompat {
    IngressNginx,
}

flag_values! {
    /// `--log-format`.
    LogFormat => crate::telemetry::logging::LogFormat {
        Text,
        Json,
    }
}

flag_values! {
    /// `--access-log-format`.
    AccessLogFormat => crate::telemetry::logging::AccessLogFormat {
        Text,
        Json,
        Upstream,
    }
}

impl RunArgs {
    /// The global settings the flags give: what a `--configmap` ConfigMap overrides.
    pub fn global_settings(&self) -> crate::snapshot::global::GlobalSettings {
        crate::snapshot::global::GlobalSettings {
            timeouts: crate::snapshot::global::Timeouts {
                connect: self.proxy.upstream_connect_timeout,
                read: self.proxy.upstream_response_timeout,
                send: self.limits.upstream_send_timeout,
            },
            underscores: self.requests.enable_underscores_in_headers,
            forwarded: std::sync::Arc::new(self.identity.forwarded()),
            server_tokens: self.proxy.server_tokens,
            proxy_protocol: self.listen.use_proxy_protocol,
            ..self.policy.global_settings(&self.tls)
        }
    }
}

impl PolicyArgs {
    /// The global settings of these flags and `tls`'s, the rest at their defaults (what
    /// `check` builds with).
    pub fn global_settings(&self, tls: &TlsArgs) -> crate::snapshot::global::GlobalSettings {
        crate::snapshot::global::GlobalSettings {
            max_body: Some(self.proxy_body_size).filter(|n| *n > 0),
            hsts: tls.hsts(),
            allow_snippets: self.allow_snippet_annotations,
            default_backend_service: self.default_backend_service.clone(),
            sources: crate::snapshot::sources::SourcePolicy {
                allow: self.whitelist_source_range.clone(),
                deny: self
                    .denylist_source_range
                    .clone()
                    .unwrap_or_else(|| std::sync::Arc::from([])),
            },
            ..crate::snapshot::global::GlobalSettings::default()
        }
    }
}

impl LogArgs {
    pub fn settings(&self) -> crate::telemetry::logging::LogSettings {
        crate::telemetry::logging::LogSettings {
            format: self.log_format.into(),
            filter: self.log_level.clone(),
            access_log: self.access_log,
            access_format: self.access_log_format.map_or_else(
                || crate::telemetry::logging::LogFormat::from(self.log_format).into(),
                Into::into,
            ),
        }
    }

    /// The OpenTelemetry pipeline, when `--otlp-endpoint` is set.
    pub fn otel(&self) -> Option<crate::telemetry::otel::OtelSettings> {
        self.otlp_endpoint
            .as_ref()
            .map(|endpoint| crate::telemetry::otel::OtelSettings {
                endpoint: endpoint.clone(),
                service_name: self.otel_service_name.clone(),
                ratio: self.otel_sampler_ratio,
                parent_based: self.otel_sampler_parent_based,
            })
    }

    /// What the proxy makes of each request for the access log.
    pub fn access_format(&self) -> crate::proxy::access_log::AccessFormat {
        use crate::proxy::access_log::AccessFormat;
        use crate::telemetry::logging::AccessLogFormat as Format;
        match self.settings().access_format {
            Format::Text => AccessFormat::Event,
            Format::Json => AccessFormat::Json,
            Format::Upstream => AccessFormat::Upstream,
        }
    }
}

fn early_reset(s: &str) -> Result<EarlyReset, String> {
    match s.trim() {
        "all" => Ok(EarlyReset::All),
        "none" => Ok(EarlyReset::Off),
        list => {
            let names: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect();
            if names.is_empty() {
                return Err("expected all, none, or interface names".into());
            }
            Ok(EarlyReset::Only(names))
        }
    }
}

fn body_size(s: &str) -> Result<u64, String> {
    crate::snapshot::annotations::size(s)
        .ok_or_else(|| format!("{s:?} is not a size (digits and an optional k, m or g)"))
}

/// `NAMESPACE/NAME`, both non-empty.
fn namespaced_name(s: &str) -> Result<ObjectKey, String> {
    match s.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(ObjectKey::new(namespace, name))
        }
        _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
    }
}

fn duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_flags_read_as_ingress_nginx_writes_them() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(["ingress"].iter().chain(args)).map(|c| c.run.kube);
        let kube = parse(&[]).unwrap();
        assert!(kube.update_status);
        assert_eq!(kube.publish_service, None);
        assert!(!parse(&["--update-status=false"]).unwrap().update_status);
        assert!(parse(&["--update-status"]).unwrap().update_status);
        assert_eq!(
            parse(&[
                "--publish-service",
                "ingress-nginx/ingress-nginx-controller"
            ])
            .unwrap()
            .publish_service,
            Some(ObjectKey::new("ingress-nginx", "ingress-nginx-controller"))
        );
        for bad in ["controller", "/controller", "ns/", "a/b/c"] {
            assert!(parse(&["--publish-service", bad]).is_err(), "{bad}");
        }
        assert_eq!(
            parse(&["--publish-status-address", "203.0.113.7,lb.example.com"])
                .unwrap()
                .publish_address
                .as_deref(),
            Some("203.0.113.7,lb.example.com")
        );
    }

    #[test]
    fn defaults_fit_a_daemonset() {
        let cli = Cli::try_parse_from(["ingress"]).unwrap();
        assert!(cli.command.is_none());
        let l = &cli.run.listen;
        assert_eq!((l.http_port, l.https_port, l.admin_port), (80, 443, 10254));
        assert_eq!(l.bind.to_string(), "0.0.0.0");
        assert_eq!(l.admin_bind.to_string(), "0.0.0.0");
        assert_eq!(l.admin_remote_access, RemoteAccess::Metrics);
    }

    #[test]
    fn subcommands_and_flags() {
        let cli = Cli::try_parse_from(["ingress", "check", "--manifests", "/tmp/x"]).unwrap();
        let Some(Command::Check(check)) = cli.command else {
            panic!("check")
        };
        assert_eq!(
            check.source.manifests.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        let cli = Cli::try_parse_from([
            "ingress",
            "--http-port",
            "8080",
            "--upstream-connect-timeout",
            "250ms",
            "--access-log",
            "false",
        ])
        .unwrap();
        assert_eq!(cli.run.listen.http_port, 8080);
        assert_eq!(
            cli.run.proxy.upstream_connect_timeout,
            Duration::from_millis(250)
        );
        assert!(!cli.run.log.access_log);
        assert!(Cli::try_parse_from(["ingress", "--http-port", "x"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["ingress", "version"]).unwrap().command,
            Some(Command::Version)
        ));
    }

    #[test]
    fn local_backends_default_by_source() {
        let cases: &[(&[&str], bool)] = &[
            (&["ingress"], false),
            (&["ingress", "--manifests", "/x"], true),
            (
                &[
                    "ingress",
                    "--manifests",
                    "/x",
                    "--allow-local-backends=false",
                ],
                false,
            ),
            (&["ingress", "--allow-local-backends"], true),
            (&["ingress", "check", "--manifests", "/x"], true),
            (&["ingress", "check"], false),
        ];
        for (argv, want) in cases {
            let cli = Cli::try_parse_from(*argv).unwrap();
            let (policy, source) = match &cli.command {
                Some(Command::Check(c)) => (&c.policy, &c.source),
                _ => (&cli.run.policy, &cli.run.source),
            };
            assert_eq!(policy.allow_local_backends(source), *want, "{argv:?}");
            assert!(!policy.allow_external_name_services, "{argv:?}");
            assert_eq!(
                policy.unsupported_access_annotations,
                UnsupportedAccess::Refuse
            );
        }
    }

    #[test]
    fn flag_combinations_that_never_take_effect_stop_startup() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (
                &["--proxy-real-ip-cidr", "10.0.0.0/8"],
                Some("--proxy-real-ip-cidr"),
            ),
            (
                &[
                    "--use-forwarded-headers",
                    "--proxy-real-ip-cidr",
                    "10.0.0.0/8",
                ],
                None,
            ),
            (
                &["--forwarded-for-header", "CF-Connecting-IP"],
                Some("--forwarded-for-header"),
            ),
            (&["--forwarded-for-header", "X-Forwarded-For"], None),
            (&["--hsts=false", "--hsts-preload"], Some("--hsts-preload")),
            (
                &["--hsts=false", "--hsts-include-subdomains"],
                Some("--hsts-include-subdomains"),
            ),
            (&["--hsts-include-subdomains"], None),
            // A ConfigMap may turn the setting on later.
            (
                &[
                    "--proxy-real-ip-cidr",
                    "10.0.0.0/8",
                    "--configmap",
                    "ns/cfg",
                ],
                None,
            ),
        ];
        for (args, flag) in cases {
            let cli = Cli::try_parse_from(["ingress"].iter().chain(*args)).unwrap();
            let got = crate::run::check_flags(&cli.run)
                .err()
                .map(|e| e.to_string());
            match flag {
                None => assert_eq!(got, None, "{args:?}"),
                Some(flag) => assert!(
                    got.as_deref().is_some_and(|e| e.starts_with(flag)),
                    "{args:?}: {got:?}"
                ),
            }
        }
        for bad in [
            &["--proxy-real-ip-cidr", "10.0.0.0/33"][..],
            &["--forwarded-for-header", "Host"],
            &["--forwarded-for-header", "a b"],
            &["--configmap", "no-namespace"],
        ] {
            let err = Cli::try_parse_from(["ingress"].iter().chain(bad)).unwrap_err();
            assert!(err.to_string().contains(bad[0]), "{bad:?}: {err}");
        }
    }

    #[test]
    fn gate_interfaces() {
        let cases = [
            (None, Some(EarlyReset::All)),
            (Some("all"), Some(EarlyReset::All)),
            (Some("none"), Some(EarlyReset::Off)),
            (
                Some("eth0, eth1"),
                Some(EarlyReset::Only(vec!["eth0".into(), "eth1".into()])),
            ),
            (Some(","), None),
        ];
        for (value, want) in cases {
            let mut argv = vec!["ingress"];
            if let Some(value) = value {
                argv.extend(["--gate-interfaces", value]);
            }
            let got = Cli::try_parse_from(argv)
                .ok()
                .map(|c| c.run.kernel.gate_interfaces);
            assert_eq!(got, want, "{value:?}");
        }
    }
}
