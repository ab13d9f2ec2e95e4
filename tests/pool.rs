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
//! to the threads, and with the threads collecting the grants their
//! returned slots make (`CpuPoolBuilder::collect_grants`), each set
//! explicitly; how `build` chooses between them when it is not set is
//! tested last.

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

/// `collect_grants` left unset: chosen by `build` from the cores, on only
/// where the pool's threads and its runtime's workers fit in them.
mod collect_grants_chosen_from_the_cores {
    use admission::pool::CpuPool;

    fn cores() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    #[test]
    fn a_pool_built_outside_a_runtime_does_not_collect_unless_told() {
        let unset = CpuPool::builder().threads(1).build().unwrap();
        assert!(!unset.snapshot().collects_grants);
        let told = CpuPool::builder()
            .threads(1)
            .collect_grants(true)
            .build()
            .unwrap();
        assert!(told.snapshot().collects_grants);
    }

    #[test]
    fn beside_one_worker_the_pool_collects_when_its_threads_fit_in_the_cores_left() {
        let cores = cores();
        // A current-thread runtime has one worker.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let fits = CpuPool::builder()
                .threads(cores.saturating_sub(1).max(1))
                .build()
                .unwrap();
            assert_eq!(fits.snapshot().collects_grants, cores >= 2, "{cores} cores");
            let shares = CpuPool::builder().threads(cores).build().unwrap();
            assert!(!shares.snapshot().collects_grants);
            let told_on = CpuPool::builder()
                .threads(cores)
                .collect_grants(true)
                .build()
                .unwrap();
            assert!(told_on.snapshot().collects_grants);
            let told_off = CpuPool::builder()
                .threads(1)
                .collect_grants(false)
                .build()
                .unwrap();
            assert!(!told_off.snapshot().collects_grants);
            assert!(format!("{fits:?}").contains("collects_grants"));
        });
    }

    #[test]
    fn the_default_pool_beside_the_default_runtime_does_not_collect() {
        // A worker a core and a thread a core: they share every core.
        let runtime = tokio::runtime::Builder::new_multi_thread().build().unwrap();
        let pool = runtime.block_on(async { CpuPool::builder().build().unwrap() });
        assert_eq!(pool.threads(), cores());
        assert!(!pool.snapshot().collects_grants);
    }
}
