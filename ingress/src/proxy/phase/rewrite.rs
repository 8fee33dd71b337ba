//! The rewrite phase: the target the upstream is sent, when the route's policy rewrites it.
//!
//! ```text
//!   rewrite-target: the route's path regex on the normalised path ─ match ─> template($1..$9)
//!                   + the client's query, unchanged; X-Forwarded-Prefix when the Ingress asks
//!                   no match ─> the target as routed
//! ```
//!
//! The rewritten path is made of the annotation's literal characters (letters, digits,
//! `-._~/:`) and pieces of the already validated and normalised request path, so it needs no
//! second validation.

use std::borrow::Cow;
use std::sync::Arc;

use ingress_wire::target::Target;

use crate::snapshot::policy::RewritePolicy;

/// Rewrites `target` in place; returns the `X-Forwarded-Prefix` to send, if any.
pub(crate) fn apply(policy: &RewritePolicy, target: &mut Target<'_>) -> Option<Arc<str>> {
    let rewrite = policy.target.as_ref()?;
    let path = rewrite.apply(&target.path)?;
    target.path = Cow::Owned(path);
    rewrite.forwarded_prefix.clone()
}
