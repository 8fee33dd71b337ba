//! `custom-http-errors` (the annotation and the ConfigMap key) and
//! `disable-proxy-intercept-errors`: which response codes are replaced by a page from the error
//! backend (the `default-backend` annotation's Service, else the global default backend).
//!
//! ```text
//!   annotation "404, 503"  ── every item 400..=599 ──> codes (sorted, deduplicated)
//!                          └─ any item not ──────────> InvalidAnnotation, not applied
//!   ConfigMap  "404,503"   ── items 300..=599 kept, others dropped with a warning
//!                             (ingress-nginx's filterErrors)
//! ```

use std::sync::Arc;

/// The codes of an annotation value: comma-separated, blanks around items and empty items
/// ignored (as ingress-nginx's parser), each a code in 400..=599. Any other item makes the
/// whole value invalid (ingress-nginx's validation regex refuses it).
pub fn parse_annotation(value: &str) -> Result<Arc<[u16]>, String> {
    let mut codes = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match code(item) {
            Some(n) if (400..=599).contains(&n) => codes.push(n),
            _ => return Err(format!("{item:?} is not an HTTP status code in 400..=599")),
        }
    }
    Ok(sorted(codes))
}

/// The codes of the ConfigMap key: items in 300..=599 are kept, each other item is returned
/// as a problem and dropped, as ingress-nginx keeps the valid ones with a warning.
pub fn parse_global(value: &str) -> (Arc<[u16]>, Vec<String>) {
    let mut codes = Vec::new();
    let mut problems = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match code(item) {
            Some(n) if (300..=599).contains(&n) => codes.push(n),
            _ => problems.push(format!(
                "{item:?} is not an HTTP status code in 300..=599; it is left out"
            )),
        }
    }
    (sorted(codes), problems)
}

fn code(item: &str) -> Option<u16> {
    if item.len() != 3 || !item.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    item.parse().ok()
}

fn sorted(mut codes: Vec<u16>) -> Arc<[u16]> {
    codes.sort_unstable();
    codes.dedup();
    codes.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_values() {
        let cases: &[(&str, Option<&[u16]>)] = &[
            ("404,503", Some(&[404, 503])),
            ("503, 404 ,404", Some(&[404, 503])),
            ("404,", Some(&[404])),
            ("", Some(&[])),
            ("599,400", Some(&[400, 599])),
            ("399", None),
            ("600", None),
            ("404,abc", None),
            ("4040", None),
            ("+404", None),
            ("404;503", None),
            ("302", None),
        ];
        for (value, want) in cases {
            let got = parse_annotation(value).ok();
            assert_eq!(got.as_deref(), *want, "{value:?}");
        }
    }

    #[test]
    fn configmap_values() {
        let cases: &[(&str, &[u16], usize)] = &[
            ("404,503", &[404, 503], 0),
            ("302, 404", &[302, 404], 0),
            ("404,200,x,600", &[404], 3),
            ("", &[], 0),
        ];
        for (value, want, problems) in cases {
            let (got, why) = parse_global(value);
            assert_eq!(&*got, *want, "{value:?}");
            assert_eq!(why.len(), *problems, "{value:?}: {why:?}");
        }
    }
}
