//! The proxy's two ways of gating and moving bytes, and the macro that runs one scenario in
//! both: a client must not be able to tell them apart, so a scenario is written once and
//! `both_modes!` makes its `_ebpf` and `_userspace` tests.
//!
//! ```text
//!   both_modes!(served);           #[tokio::test] async fn served_ebpf()      { served(Mode::Ebpf).await }
//!   async fn served(mode: Mode)  → #[tokio::test] async fn served_userspace() { served(Mode::Userspace).await }
//! ```

/// `--mode ebpf` (the kernel gate and splicing) or `--mode userspace` (the same policy after
/// accept, bytes copied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ebpf,
    Userspace,
}

impl Mode {
    /// The `--mode` value.
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Userspace => "userspace",
        }
    }

    /// The `mode` label of the passthrough metrics.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Ebpf => "kernel",
            Mode::Userspace => "userspace",
        }
    }
}

/// For each `scenario` (an `async fn scenario(mode: Mode)` in scope), the tests
/// `scenario_ebpf` and `scenario_userspace`: the names CI logs have always shown.
#[macro_export]
macro_rules! both_modes {
    ($($scenario:ident),+ $(,)?) => {
        $crate::pastey::paste! {
            $(
                #[tokio::test]
                async fn [<$scenario _ebpf>]() {
                    $scenario($crate::Mode::Ebpf).await;
                }

                #[tokio::test]
                async fn [<$scenario _userspace>]() {
                    $scenario($crate::Mode::Userspace).await;
                }
            )+
        }
    };
}
