//! Working memory for one decision, private to the run that claimed it.
//!
//! ```text
//!   WORKSPACES: per CPU, WORKSPACE_LEVELS slots    BUSY: per CPU, one flag per slot
//!   claim():   the first slot whose flag goes 0 → 1 (compare-and-swap) is this run's
//!   release(): its flag back to 0
//! ```
//!
//! The stream verdict runs in softirq and in process context (the strparser's work, and a
//! `recv` from userspace, under the socket lock only, with migration disabled but preemption
//! and bottom halves enabled). So on one CPU a run can be preempted by another task's run, and
//! any run can be interrupted by a softirq's. A single per-CPU slot was shared by all of them:
//! the inner run saw the outer one's half-built duplicate-extension bitmap and key. A
//! compare-and-swap flag per slot gives every run a slot no other run touches until it is
//! released, whatever interrupts whom; the flag is this CPU's, and an atomic instruction cannot
//! be split by an interrupt, so no lock is needed. (CPU v3 instructions: the eBPF object is
//! built for them.)

use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xchg};

use aya_ebpf::{btf_maps::PerCpuArray, macros::btf_map};
use ingress_common::WORKSPACE_LEVELS;

use crate::hello::Workspace;

#[btf_map]
static WORKSPACES: PerCpuArray<Workspace, LEVELS> = PerCpuArray::new();
#[btf_map]
static BUSY: PerCpuArray<u32, LEVELS> = PerCpuArray::new();

const LEVELS: usize = WORKSPACE_LEVELS as usize;

/// A claimed slot; hand it back with [`release`] on every path.
pub struct Claim {
    flag: *mut u32,
    pub work: *mut Workspace,
}

/// This run's own workspace, or `None` if every slot of this CPU is in use.
#[inline(always)]
pub fn claim() -> Option<Claim> {
    for level in 0..WORKSPACE_LEVELS {
        let Some(flag) = BUSY.get_ptr_mut(level) else {
            continue;
        };
        // SAFETY: a live, 4-byte-aligned per-CPU map value; only atomic operations touch it
        // while it may be shared.
        let (_, won) = unsafe {
            atomic_cxchg::<u32, { AtomicOrdering::Acquire }, { AtomicOrdering::Relaxed }>(
                flag, 0, 1,
            )
        };
        if !won {
            continue;
        }
        match WORKSPACES.get_ptr_mut(level) {
            Some(work) => return Some(Claim { flag, work }),
            // SAFETY: as above; this run owns the flag.
            None => unsafe {
                atomic_xchg::<u32, { AtomicOrdering::Release }>(flag, 0);
            },
        }
    }
    None
}

/// Hands the slot back.
#[inline(always)]
pub fn release(claim: Claim) {
    // An exchange rather than a store: this CPU version has no store-release, and the exchange
    // also keeps every write to the workspace before the flag clears.
    // SAFETY: as in `claim`; this run owns the flag until this exchange.
    unsafe { atomic_xchg::<u32, { AtomicOrdering::Release }>(claim.flag, 0) };
}
