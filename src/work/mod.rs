//! Work classification: what a piece of work is, for the purpose of ordering it.
//!
//! Every admission request carries a [`WorkInfo`]: the [`TenantId`] it is done
//! for, its [`Priority`] on the ladder, the time it was created (older work of
//! the same priority goes first), an optional deadline, and whether it may
//! bypass admission entirely. Tenant weights ([`TenantWeight`]) decide how the
//! queue divides capacity between tenants that are all waiting.

mod info;
mod priority;
mod tenant;

pub use info::{WorkInfo, WorkInfoBuilder};
pub use priority::Priority;
pub use tenant::{TenantId, TenantWeight};
