//! GPU admission and device-memory governance.
//!
//! (The design overview is written as the module lands; see
//! `docs/ARCHITECTURE.md` and `../shared/seeds/001_07186211194acf4e.txt`.)

// Profiles, the ledger and placement: pure integer accounting, no CUDA.
#[cfg(feature = "config")]
pub mod config;
pub mod ledger;
pub mod outcome;
pub mod placement;
pub mod profile;
pub mod proof;

// The physical side: backends, allocation domains, device workers and the
// transactional envelope.
pub mod backend;
pub mod domain;
pub mod envelope;
pub mod worker;
