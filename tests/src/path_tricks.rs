//! The edge-hardening corpus of request targets that try to make what is routed differ from
//! what a backend reads, written against a protected prefix: `edge_requests` checks that the
//! proxy refuses or normalises each one, and the access-control tests (basic, digest and
//! external auth, source ranges) that none reaches the protected path without passing its
//! check. One list, so a trick added for the edge is tried against every access control.
//!
//! ```text
//!   {p}  the protected prefix's segment ("admin")   {p%}  the same, its first byte escaped
//!   {o}  a segment of an open path ("public")       {P}   the protected segment upper-cased
//! ```

/// Targets the proxy refuses with 400 before routing: a fragment, a byte URIs forbid, an
/// escaped slash or backslash that would route elsewhere once decoded, a dot-segment with
/// parameters, a path above the root.
pub const REFUSED: &[&str] = &[
    "/{p}/secret#/../../x",
    "/{p}#x",
    "/{p}\\x",
    "/{p}%00",
    "/{p}%zz",
    "/{o}/..%2F{p}",
    "/{o}/..%2f{p}",
    "/{o}/..%5C{p}",
    "/x/..%2F{p}/secret",
    "/{o}/..;/{p}",
    "/../{p}",
    "/a/%2e%2e/%2e%2e/{p}",
];

/// Targets the proxy normalises to `/{p}/x` (with the query kept), so they route to the
/// protected path, as what the backend reads.
pub const NORMALISED: &[(&str, &str)] = &[
    ("/{o}/../{p}/x", "/{p}/x"),
    ("/{o}/%2e%2e/{p}/x", "/{p}/x"),
    ("/{o}/%2E%2E/{p}/x", "/{p}/x"),
    ("//{p}//x", "/{p}/x"),
    ("/./{p}/x", "/{p}/x"),
    ("/{p%}/x?y=1", "/{p}/x?y=1"),
];

/// Targets that keep a look of the protected path and route elsewhere or nowhere: they must
/// not reach it either way.
pub const LOOKALIKES: &[&str] = &[
    "/{P}/x",
    "/{p};/x",
    "/{p}%2fx",
    "/{p}/x?../../{o}",
    "/{p}.",
    "/{p}%20",
];

/// `template` with the markers filled in for `protected` (a segment such as `admin`) and
/// `open`.
pub fn fill(template: &str, protected: &str, open: &str) -> String {
    let escaped = match protected.as_bytes().first() {
        Some(first) => format!("%{first:02x}{}", &protected[1..]),
        None => String::new(),
    };
    template
        .replace("{p%}", &escaped)
        .replace("{P}", &protected.to_ascii_uppercase())
        .replace("{p}", protected)
        .replace("{o}", open)
}

/// Every target of the corpus aimed at `protected`, plus the protected path itself in its
/// plain forms: what an access-control test sends without credentials.
pub fn toward(protected: &str, open: &str) -> Vec<String> {
    let plain = ["/{p}", "/{p}/", "/{p}/x"];
    plain
        .iter()
        .chain(REFUSED)
        .chain(NORMALISED.iter().map(|(target, _)| target))
        .chain(LOOKALIKES)
        .map(|t| fill(t, protected, open))
        .collect()
}

/// Whether curl can send `target` as it is (`--path-as-is`): it cuts fragments off, and
/// refuses a backslash or a raw NUL escape no differently from the proxy, so those go as
/// exact bytes only.
pub fn curl_can_send(target: &str) -> bool {
    !target.contains('#')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_filled() {
        assert_eq!(fill("/{p%}/x", "admin", "open"), "/%61dmin/x");
        assert_eq!(fill("/{o}/../{P}", "admin", "open"), "/open/../ADMIN");
        let all = toward("admin", "open");
        assert!(all.iter().all(|t| !t.contains('{')), "{all:?}");
        assert_eq!(
            all.len(),
            3 + REFUSED.len() + NORMALISED.len() + LOOKALIKES.len()
        );
    }
}
