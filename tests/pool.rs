//! The CPU pool's behaviour: order, cancellation before the start,
//! deadlines, panics, close and drop, bypass borrowing, the exact signal,
//! and configuration errors.
//!
//! Pool threads are OS threads, so the tests synchronize with them through
//! channels (a closure says when it starts and waits for its gate to open)
//! and decide when each future is polled; nothing sleeps to let a thread
//! catch up, and no assertion depends on how long anything took.

//!
//! Every case runs twice: with the caller's task handing each admitted job
//! to the threads (the default), and with the threads collecting the
//! grants their returned slots make (`CpuPoolBuilder::collect_grants`).

/// The caller's task hands each admitted job over.
mod task_hands_over {
    const COLLECT_GRANTS: bool = false;
    include!("pool/cases.rs");
}

/// The thread whose slot made a grant collects it.
mod threads_collect_grants {
    const COLLECT_GRANTS: bool = true;
    include!("pool/cases.rs");
}
