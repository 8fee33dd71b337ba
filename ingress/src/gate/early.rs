//! The early reset: `gate_early` on the TC ingress hook of the node's interfaces.
//!
//! ```text
//!   load ─► attach to the wanted interfaces ─► every RESCAN: attach to new ones, forget gone ones
//!   wanted(): All  → every Ethernet and loopback interface (the program reads an Ethernet header)
//!             Only → the named ones, if Ethernet or loopback
//!             Off  → none
//! ```
//!
//! The program is a shortcut in front of the socket path, never a replacement: a connection it
//! does not judge (a ClientHello split over segments, traffic through an interface it is not on)
//! is judged after accept exactly as without it. Interfaces are attached with TCX links, which
//! coexist with other programs on the same hook (a CNI's, for instance) and go away with this
//! process or with the interface.
//!
//! Order on the hook matters: `tcx_run` stops at the first program whose verdict is not "next",
//! and a CNI's programs return OK or redirect. So the program is attached first, and each
//! rescan reads the hook's order back: a program attached before it since (a CNI restarted, say)
//! is reported (`Shadowed`: a warning, and `ingress_ebpf_early_reset_shadowed`), not fought
//! over. Connections it no longer sees are still judged after accept.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType,
    tc::{SchedClassifierLinkId, TcAttachOptions},
};

use super::sys::{self, ARPHRD_ETHER, ARPHRD_LOOPBACK, Interface};
use super::{GateError, Result, lock};

/// How often the interface list is read again (pod veths come and go on a node).
pub const RESCAN: Duration = Duration::from_secs(5);
/// The program's name in the object.
pub const PROGRAM: &str = "gate_early";

/// Where the early reset runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EarlyReset {
    /// Every Ethernet and loopback interface of the namespace, including ones that appear later.
    All,
    /// These interfaces, by name (attached when they appear).
    Only(Vec<String>),
    /// Nowhere: every connection is judged after accept.
    #[default]
    Off,
}

/// An interface where other TC programs run before `gate_early`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shadowed {
    pub interface: String,
    /// The programs ahead of it: (id, name).
    pub by: Vec<(u32, String)>,
}

/// The loaded programs and the interfaces `gate_early` is attached to. Dropping it detaches
/// everything.
pub(super) struct Programs {
    pub ebpf: aya::Ebpf,
    attached: BTreeMap<u32, (String, SchedClassifierLinkId)>,
    /// Interfaces whose attach failed, so a failure is logged once, not every rescan.
    failing: BTreeSet<String>,
    /// Interfaces where something runs first, as of the last sync.
    shadowed: BTreeMap<String, Shadowed>,
}

/// What one `sync` changed.
#[derive(Debug, Default)]
pub(super) struct SyncOutcome {
    pub attached: Vec<String>,
    pub detached: Vec<String>,
    /// Newly failing: (interface, why).
    pub failed: Vec<(String, String)>,
    /// Named in `Only` but absent or not Ethernet/loopback.
    pub unusable: Vec<String>,
    /// Newly shadowed interfaces, and ones no longer shadowed.
    pub shadowed: Vec<Shadowed>,
    pub unshadowed: Vec<String>,
}

impl Programs {
    pub fn new(ebpf: aya::Ebpf) -> Programs {
        Programs {
            ebpf,
            attached: BTreeMap::new(),
            failing: BTreeSet::new(),
            shadowed: BTreeMap::new(),
        }
    }

    pub fn shadowed(&self) -> Vec<Shadowed> {
        self.shadowed.values().cloned().collect()
    }

    /// The names of the interfaces the program is attached to.
    pub fn interfaces(&self) -> Vec<String> {
        self.attached
            .values()
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Brings the attachments in line with `mode` and the interfaces present now.
    pub fn sync(&mut self, mode: &EarlyReset) -> Result<SyncOutcome> {
        let present = sys::interfaces().map_err(GateError::Socket)?;
        let (wanted, unusable) = wanted(mode, &present);
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or(GateError::Missing(PROGRAM))?
            .try_into()
            .map_err(|source| GateError::Program {
                name: PROGRAM,
                source,
            })?;
        let mut outcome = SyncOutcome {
            unusable,
            ..SyncOutcome::default()
        };
        let keep: BTreeSet<(u32, &str)> =
            wanted.iter().map(|i| (i.index, i.name.as_str())).collect();
        let gone: Vec<u32> = self
            .attached
            .iter()
            .filter(|(index, (name, _))| !keep.contains(&(**index, name.as_str())))
            .map(|(index, _)| *index)
            .collect();
        for index in gone {
            if let Some((name, link)) = self.attached.remove(&index) {
                // An interface that vanished took its link with it; closing ours can only fail
                // harmlessly.
                let _ = prog.detach(link);
                outcome.detached.push(name);
            }
        }
        for iface in wanted {
            if self.attached.contains_key(&iface.index) {
                continue;
            }
            match attach_first(prog, &iface.name) {
                Ok(link) => {
                    self.failing.remove(&iface.name);
                    self.attached
                        .insert(iface.index, (iface.name.clone(), link));
                    outcome.attached.push(iface.name.clone());
                }
                Err(e) => {
                    if self.failing.insert(iface.name.clone()) {
                        outcome.failed.push((iface.name.clone(), super::chain(&e)));
                    }
                }
            }
        }
        let ours = prog.info().map(|info| info.id()).ok();
        let mut now = BTreeMap::new();
        for (name, _) in self.attached.values() {
            let ahead = ours.and_then(|id| ahead_of(id, name));
            if let Some(by) = ahead.filter(|by| !by.is_empty()) {
                now.insert(
                    name.clone(),
                    Shadowed {
                        interface: name.clone(),
                        by,
                    },
                );
            }
        }
        outcome.shadowed = now
            .values()
            .filter(|s| self.shadowed.get(&s.interface) != Some(*s))
            .cloned()
            .collect();
        outcome.unshadowed = self
            .shadowed
            .keys()
            .filter(|name| !now.contains_key(*name))
            .cloned()
            .collect();
        self.shadowed = now;
        Ok(outcome)
    }
}

/// Attaches before every program already on the interface's TCX ingress hook (on kernels
/// without TCX, through a tc filter, where order cannot be chosen).
fn attach_first(
    prog: &mut SchedClassifier,
    interface: &str,
) -> std::result::Result<SchedClassifierLinkId, aya::programs::ProgramError> {
    let tcx = aya::util::KernelVersion::current()
        .is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0));
    if tcx {
        prog.attach_with_options(
            interface,
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        )
    } else {
        prog.attach(interface, TcAttachType::Ingress)
    }
}

/// The programs that run before program `ours` on `interface`'s TCX ingress hook; `None` if
/// the hook cannot be read (no TCX) or `ours` is not on it.
fn ahead_of(ours: u32, interface: &str) -> Option<Vec<(u32, String)>> {
    let (_, programs) = SchedClassifier::query_tcx(interface, TcAttachType::Ingress).ok()?;
    let at = programs.iter().position(|p| p.id() == ours)?;
    Some(
        programs
            .iter()
            .take(at)
            .map(|p| (p.id(), p.name_as_str().unwrap_or("?").to_string()))
            .collect(),
    )
}

/// The interfaces `mode` asks for among `present`, and the named ones that cannot be used.
pub fn wanted<'a>(
    mode: &EarlyReset,
    present: &'a [Interface],
) -> (Vec<&'a Interface>, Vec<String>) {
    let usable = |i: &Interface| matches!(i.link_type, ARPHRD_ETHER | ARPHRD_LOOPBACK);
    match mode {
        EarlyReset::Off => (Vec::new(), Vec::new()),
        EarlyReset::All => (present.iter().filter(|i| usable(i)).collect(), Vec::new()),
        EarlyReset::Only(names) => {
            let chosen: Vec<&Interface> = present
                .iter()
                .filter(|i| names.contains(&i.name) && usable(i))
                .collect();
            let unusable = names
                .iter()
                .filter(|n| !chosen.iter().any(|i| &i.name == *n))
                .cloned()
                .collect();
            (chosen, unusable)
        }
    }
}

/// Logs what a sync changed: attachments at info, failures at warn.
pub(super) fn report(outcome: &SyncOutcome) {
    if !outcome.attached.is_empty() || !outcome.detached.is_empty() {
        tracing::info!(
            attached = ?outcome.attached,
            detached = ?outcome.detached,
            "early reset (TC ingress) interfaces changed"
        );
    }
    for (name, why) in &outcome.failed {
        tracing::warn!(interface = %name, error = %why, "could not attach the early reset; connections through it are judged after accept");
    }
    for shadowed in &outcome.shadowed {
        let by: Vec<String> = shadowed
            .by
            .iter()
            .map(|(id, name)| format!("{name} (id {id})"))
            .collect();
        tracing::warn!(
            interface = %shadowed.interface,
            ahead = ?by,
            "another TC program runs before the early reset; if it returns a verdict, the early reset never sees the packet and connections through this interface are judged after accept"
        );
    }
    for name in &outcome.unshadowed {
        tracing::info!(interface = %name, "the early reset runs first again");
    }
}

/// Re-reads the interfaces every RESCAN until the gate is gone.
pub(super) async fn rescan(programs: Weak<Mutex<Programs>>, mode: EarlyReset) {
    let mut tick = tokio::time::interval(RESCAN);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(programs) = programs.upgrade() else {
            return;
        };
        let outcome = lock(&programs).sync(&mode);
        match outcome {
            Ok(outcome) => report(&outcome),
            Err(e) => tracing::warn!(error = %e, "reading the network interfaces failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(index: u32, name: &str, link_type: u16) -> Interface {
        Interface {
            index,
            name: name.into(),
            link_type,
        }
    }

    #[test]
    fn chooses_ethernet_and_loopback_interfaces() {
        let present = [
            iface(1, "lo", ARPHRD_LOOPBACK),
            iface(2, "eth0", ARPHRD_ETHER),
            iface(3, "wg0", 65534),
            iface(4, "veth1", ARPHRD_ETHER),
        ];
        let names = |(chosen, unusable): (Vec<&Interface>, Vec<String>)| {
            (
                chosen.iter().map(|i| i.name.clone()).collect::<Vec<_>>(),
                unusable,
            )
        };
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (EarlyReset::Off, s(&[]), s(&[])),
            (EarlyReset::All, s(&["lo", "eth0", "veth1"]), s(&[])),
            (
                EarlyReset::Only(s(&["eth0", "wg0", "eth9"])),
                s(&["eth0"]),
                s(&["wg0", "eth9"]),
            ),
        ];
        for (mode, chosen, unusable) in cases {
            assert_eq!(
                names(wanted(&mode, &present)),
                (chosen, unusable),
                "{mode:?}"
            );
        }
    }
}
