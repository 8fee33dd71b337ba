//! Types shared by the kernel programs and userspace. `no_std`, `#[repr(C)]`, no padding.
#![no_std]
