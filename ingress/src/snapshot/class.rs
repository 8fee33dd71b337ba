//! Which Ingresses this controller owns.
//!
//! In order, the first that applies decides:
//! 1. `spec.ingressClassName` names an IngressClass whose `spec.controller` is ours, or equals
//!    `--ingress-class` (so a manifests directory need not carry an IngressClass);
//! 2. the legacy `kubernetes.io/ingress.class` annotation equals `--ingress-class`;
//! 3. neither is set, and one of our IngressClasses is annotated
//!    `ingressclass.kubernetes.io/is-default-class: "true"`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use crate::store::ObjectKey;

pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSelector {
    pub ingress_class: String,
    pub controller_class: String,
}

impl ClassSelector {
    /// Whether `ingress` is ours, given the IngressClasses in the store.
    pub fn owns(
        &self,
        ingress: &Ingress,
        classes: &BTreeMap<ObjectKey, Arc<IngressClass>>,
    ) -> bool {
        let class_name = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref());
        if let Some(name) = class_name.filter(|n| !n.is_empty()) {
            return name == self.ingress_class
                || classes
                    .get(&ObjectKey::new("", name))
                    .is_some_and(|c| self.is_ours(c));
        }
        let legacy = ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION));
        if let Some(legacy) = legacy {
            return *legacy == self.ingress_class;
        }
        classes.values().any(|c| self.is_ours(c) && is_default(c))
    }

    fn is_ours(&self, class: &IngressClass) -> bool {
        class.spec.as_ref().and_then(|s| s.controller.as_deref())
            == Some(self.controller_class.as_str())
    }
}

fn is_default(class: &IngressClass) -> bool {
    class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
        .map(String::as_str)
        == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::{IngressClassSpec, IngressSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(name: &str, controller: &str, default: bool) -> (ObjectKey, Arc<IngressClass>) {
        let annotations =
            default.then(|| [(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())].into());
        let class = IngressClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations,
                ..Default::default()
            },
            spec: Some(IngressClassSpec {
                controller: Some(controller.into()),
                ..Default::default()
            }),
        };
        (ObjectKey::new("", name), Arc::new(class))
    }

    fn ingress(class_name: Option<&str>, legacy: Option<&str>) -> Ingress {
        Ingress {
            metadata: ObjectMeta {
                name: Some("i".into()),
                annotations: legacy
                    .map(|l| [(LEGACY_CLASS_ANNOTATION.to_string(), l.to_string())].into()),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                ingress_class_name: class_name.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn selection_table() {
        let sel = ClassSelector {
            ingress_class: "ingress".into(),
            controller_class: "ingress.rs/controller".into(),
        };
        let ours = class("fast", "ingress.rs/controller", false);
        let ours_default = class("fast", "ingress.rs/controller", true);
        let theirs = class("nginx", "k8s.io/ingress-nginx", false);
        let theirs_default = class("nginx", "k8s.io/ingress-nginx", true);
        let cases: &[(&str, Vec<(ObjectKey, Arc<IngressClass>)>, Ingress, bool)] = &[
            (
                "class object is ours",
                vec![ours.clone()],
                ingress(Some("fast"), None),
                true,
            ),
            (
                "class object is theirs",
                vec![theirs.clone()],
                ingress(Some("nginx"), None),
                false,
            ),
            ("class missing", vec![], ingress(Some("fast"), None), false),
            (
                "class named like --ingress-class",
                vec![],
                ingress(Some("ingress"), None),
                true,
            ),
            (
                "field beats legacy annotation",
                vec![theirs.clone()],
                ingress(Some("nginx"), Some("ingress")),
                false,
            ),
            (
                "legacy annotation ours",
                vec![],
                ingress(None, Some("ingress")),
                true,
            ),
            (
                "legacy annotation theirs",
                vec![ours_default.clone()],
                ingress(None, Some("nginx")),
                false,
            ),
            (
                "no class, our default",
                vec![ours_default.clone()],
                ingress(None, None),
                true,
            ),
            (
                "no class, no default",
                vec![ours.clone()],
                ingress(None, None),
                false,
            ),
            (
                "no class, their default",
                vec![theirs_default],
                ingress(None, None),
                false,
            ),
            (
                "empty class name is unset",
                vec![ours_default],
                ingress(Some(""), None),
                true,
            ),
        ];
        for (name, classes, ing, want) in cases {
            let classes: BTreeMap<_, _> = classes.iter().cloned().collect();
            assert_eq!(sel.owns(ing, &classes), *want, "{name}");
        }
    }
}
