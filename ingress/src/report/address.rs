//! The address written into `status.loadBalancer.ingress`: `--publish-address`, or else the
//! ExternalIP (then InternalIP) of the node named by `NODE_NAME` (the downward API).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use kube::{Api, Client};

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
    let mut delay = std::time::Duration::from_millis(200);
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
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

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
}
