//! The addresses written into `status.loadBalancer.ingress`, chosen as ingress-nginx chooses
//! them: `--publish-address` (a comma-separated list), else the addresses of the Service named by
//! `--publish-service` (followed as it changes: a LoadBalancer gets its address late), else the
//! ExternalIP (then InternalIP) of the node named by `NODE_NAME` (the downward API).

use std::net::IpAddr;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::store::ObjectKey;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishAddress {
    Ip(IpAddr),
    Hostname(String),
}

impl PublishAddress {
    pub fn parse(value: &str) -> PublishAddress {
        match value.parse::<IpAddr>() {
            Ok(ip) => PublishAddress::Ip(ip),
            Err(_) => PublishAddress::Hostname(value.to_string()),
        }
    }

    /// The status entry, and its short form for comparisons and logs.
    pub fn status_entry(&self) -> IngressLoadBalancerIngress {
        match self {
            PublishAddress::Ip(ip) => IngressLoadBalancerIngress {
                ip: Some(ip.to_string()),
                ..Default::default()
            },
            PublishAddress::Hostname(h) => IngressLoadBalancerIngress {
                hostname: Some(h.clone()),
                ..Default::default()
            },
        }
    }

    pub fn as_string(&self) -> String {
        match self {
            PublishAddress::Ip(ip) => ip.to_string(),
            PublishAddress::Hostname(h) => h.clone(),
        }
    }
}

/// Parses `--publish-address`: addresses separated by commas (and optional spaces); empty
/// items are skipped. The result is sorted, as every address list here is.
pub fn parse_list(value: &str) -> Vec<PublishAddress> {
    normalised(
        value
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(PublishAddress::parse)
            .collect(),
    )
}

/// Sorted and deduplicated, so two lists compare equal when they name the same addresses.
fn normalised(mut list: Vec<PublishAddress>) -> Vec<PublishAddress> {
    list.sort_by_key(PublishAddress::as_string);
    list.dedup();
    list
}

/// Where the status addresses come from, in ingress-nginx's order of precedence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressSource {
    /// `--publish-address`.
    Fixed(Vec<PublishAddress>),
    /// `--publish-service`.
    Service(ObjectKey),
    /// `NODE_NAME`.
    Node(String),
    /// Nothing to publish: status is left alone.
    Nothing,
}

impl AddressSource {
    pub fn choose(
        publish_address: Option<&str>,
        publish_service: Option<&ObjectKey>,
        node_name: Option<&str>,
    ) -> AddressSource {
        match (publish_address, publish_service, node_name) {
            (Some(list), _, _) => AddressSource::Fixed(parse_list(list)),
            (None, Some(service), _) => AddressSource::Service(service.clone()),
            (None, None, Some(node)) => AddressSource::Node(node.to_string()),
            (None, None, None) => AddressSource::Nothing,
        }
    }

    /// The addresses as they are now and as they change. A fixed list or a node's address is
    /// sent once; a Service's whenever it changes.
    pub fn follow(self, client: Client) -> watch::Receiver<Vec<PublishAddress>> {
        let (tx, rx) = watch::channel(Vec::new());
        match self {
            AddressSource::Fixed(list) => {
                tx.send_replace(list);
            }
            AddressSource::Nothing => {
                tracing::warn!(
                    "none of --publish-address, --publish-service or NODE_NAME is set; Ingress status will not be written"
                );
            }
            AddressSource::Node(node) => {
                tokio::spawn(async move {
                    if let Some(address) = from_node(client, &node).await {
                        tx.send_replace(vec![address]);
                    }
                    // Keep the channel open: the reporter keeps the last value.
                    tx.closed().await;
                });
            }
            AddressSource::Service(key) => {
                tokio::spawn(follow_service(client, key, tx));
            }
        }
        rx
    }
}

/// The addresses of a Service, as ingress-nginx's `--publish-service` reads them: an
/// ExternalName's name; a ClusterIP's cluster IP; a NodePort's external IPs, else its cluster
/// IP; a LoadBalancer's status addresses followed by any external IP not among them.
pub fn service_addresses(service: &Service) -> Vec<PublishAddress> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let cluster_ip = || {
        spec.cluster_ip
            .iter()
            .filter(|ip| !ip.is_empty() && ip.as_str() != "None")
            .map(|ip| PublishAddress::parse(ip))
            .collect::<Vec<_>>()
    };
    let external_ips = || {
        spec.external_ips
            .iter()
            .flatten()
            .map(|ip| PublishAddress::parse(ip))
            .collect::<Vec<_>>()
    };
    let list = match spec.type_.as_deref().unwrap_or("ClusterIP") {
        "ExternalName" => spec
            .external_name
            .iter()
            .map(|name| PublishAddress::Hostname(name.clone()))
            .collect(),
        "NodePort" if spec.external_ips.as_ref().is_some_and(|v| !v.is_empty()) => external_ips(),
        "ClusterIP" | "NodePort" => cluster_ip(),
        "LoadBalancer" => {
            let mut list: Vec<PublishAddress> = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|entry| match (&entry.ip, &entry.hostname) {
                    (Some(ip), _) if !ip.is_empty() => Some(PublishAddress::parse(ip)),
                    (_, Some(host)) if !host.is_empty() => {
                        Some(PublishAddress::Hostname(host.clone()))
                    }
                    _ => None,
                })
                .collect();
            list.extend(external_ips());
            list
        }
        _ => Vec::new(),
    };
    normalised(list)
}

/// Follows one Service by name. While it does not exist, or has no address yet (a
/// LoadBalancer waiting for its cloud), the list is empty and status is left as it is.
async fn follow_service(client: Client, key: ObjectKey, tx: watch::Sender<Vec<PublishAddress>>) {
    let api: Api<Service> = Api::namespaced(client, &key.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        let addresses = match event {
            Ok(Event::Apply(service) | Event::InitApply(service)) => service_addresses(&service),
            Ok(Event::Delete(_)) => Vec::new(),
            Ok(Event::Init | Event::InitDone) => continue,
            Err(err) => {
                tracing::warn!(service = %key, %err, "cannot watch the --publish-service Service; retrying");
                continue;
            }
        };
        if addresses.is_empty() {
            tracing::info!(service = %key, "the --publish-service Service has no address yet; Ingress status is left as it is");
        }
        tx.send_if_modified(|current| {
            let changed = *current != addresses;
            *current = addresses;
            changed
        });
        if tx.is_closed() {
            return;
        }
    }
}

/// Picks a node's address: ExternalIP first, then InternalIP.
pub fn node_address(node: &Node) -> Option<PublishAddress> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["ExternalIP", "InternalIP"]
        .iter()
        .find_map(|wanted| addresses.iter().find(|a| a.type_ == *wanted))
        .map(|a| PublishAddress::parse(&a.address))
}

/// Reads the node's address, retrying with backoff until the API answers (the address does not
/// change while the pod runs). `None` if the node has no usable address.
pub async fn from_node(client: Client, node_name: &str) -> Option<PublishAddress> {
    let nodes: Api<Node> = Api::all(client);
    let mut delay = Duration::from_millis(200);
    loop {
        match nodes.get(node_name).await {
            Ok(node) => {
                let address = node_address(&node);
                if address.is_none() {
                    tracing::warn!(
                        node = node_name,
                        "node has no ExternalIP or InternalIP; Ingress status will not be written"
                    );
                }
                return address;
            }
            Err(err) => {
                tracing::warn!(node = node_name, %err, "cannot read node for its address; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeStatus, ServiceSpec,
        ServiceStatus,
    };

    fn node(addresses: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: t.to_string(),
                            address: a.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn prefers_external_then_internal() {
        let cases = [
            (
                vec![("InternalIP", "10.0.0.5"), ("ExternalIP", "203.0.113.5")],
                Some("203.0.113.5"),
            ),
            (
                vec![("Hostname", "n1"), ("InternalIP", "10.0.0.5")],
                Some("10.0.0.5"),
            ),
            (vec![("Hostname", "n1")], None),
        ];
        for (addresses, want) in cases {
            assert_eq!(
                node_address(&node(&addresses))
                    .map(|a| a.as_string())
                    .as_deref(),
                want
            );
        }
        assert_eq!(
            PublishAddress::parse("lb.example.com"),
            PublishAddress::Hostname("lb.example.com".into())
        );
    }

    #[test]
    fn publish_address_lists() {
        let cases = [
            ("203.0.113.7", vec!["203.0.113.7"]),
            (
                "lb.example.com, 203.0.113.7,,198.51.100.1",
                vec!["198.51.100.1", "203.0.113.7", "lb.example.com"],
            ),
            ("a.example, a.example", vec!["a.example"]),
            ("", vec![]),
        ];
        for (flag, want) in cases {
            let got: Vec<String> = parse_list(flag).iter().map(|a| a.as_string()).collect();
            assert_eq!(got, want, "{flag:?}");
        }
    }

    fn svc(
        type_: &str,
        cluster_ip: Option<&str>,
        external: &[&str],
        lb: &[(Option<&str>, Option<&str>)],
        external_name: Option<&str>,
    ) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.to_string()),
                cluster_ip: cluster_ip.map(str::to_string),
                external_ips: (!external.is_empty())
                    .then(|| external.iter().map(|s| s.to_string()).collect()),
                external_name: external_name.map(str::to_string),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        lb.iter()
                            .map(|(ip, host)| LoadBalancerIngress {
                                ip: ip.map(str::to_string),
                                hostname: host.map(str::to_string),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn service_addresses_follow_ingress_nginx() {
        let cases = [
            (
                "load balancer: status first, external IPs added",
                svc(
                    "LoadBalancer",
                    Some("10.96.0.10"),
                    &["198.51.100.9"],
                    &[(Some("203.0.113.7"), None), (None, Some("lb.example.com"))],
                    None,
                ),
                vec!["198.51.100.9", "203.0.113.7", "lb.example.com"],
            ),
            (
                "load balancer still pending",
                svc("LoadBalancer", Some("10.96.0.10"), &[], &[], None),
                vec![],
            ),
            (
                "an entry with both: the IP",
                svc(
                    "LoadBalancer",
                    None,
                    &[],
                    &[(Some("203.0.113.7"), Some("lb.example.com"))],
                    None,
                ),
                vec!["203.0.113.7"],
            ),
            (
                "cluster IP",
                svc(
                    "ClusterIP",
                    Some("10.96.0.10"),
                    &["198.51.100.9"],
                    &[],
                    None,
                ),
                vec!["10.96.0.10"],
            ),
            (
                "headless",
                svc("ClusterIP", Some("None"), &[], &[], None),
                vec![],
            ),
            (
                "node port with external IPs",
                svc("NodePort", Some("10.96.0.10"), &["198.51.100.9"], &[], None),
                vec!["198.51.100.9"],
            ),
            (
                "node port without",
                svc("NodePort", Some("10.96.0.10"), &[], &[], None),
                vec!["10.96.0.10"],
            ),
            (
                "external name",
                svc("ExternalName", None, &[], &[], Some("edge.example.net")),
                vec!["edge.example.net"],
            ),
        ];
        for (what, service, want) in cases {
            let got: Vec<String> = service_addresses(&service)
                .iter()
                .map(|a| a.as_string())
                .collect();
            assert_eq!(got, want, "{what}");
        }
        assert!(service_addresses(&Service::default()).is_empty());
    }

    #[test]
    fn the_source_follows_ingress_nginx_precedence() {
        let key = ObjectKey::new("ingress", "controller");
        assert_eq!(
            AddressSource::choose(Some("203.0.113.7"), Some(&key), Some("n1")),
            AddressSource::Fixed(parse_list("203.0.113.7"))
        );
        assert_eq!(
            AddressSource::choose(None, Some(&key), Some("n1")),
            AddressSource::Service(key.clone())
        );
        assert_eq!(
            AddressSource::choose(None, None, Some("n1")),
            AddressSource::Node("n1".into())
        );
        assert_eq!(
            AddressSource::choose(None, None, None),
            AddressSource::Nothing
        );
    }
}
