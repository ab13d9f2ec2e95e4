//! Handlers of several tenants and priorities await admission to two slots,
//! and print who got in when.
//!
//! Run it with `cargo run --example tenants`. Every handler arrives at once;
//! each holds its slot for 20 ms. Watch the order: within a tenant, higher
//! priority first; between tenants, whoever holds fewer slots relative to
//! its weight (tenant 3 has weight 2, so it gets in about twice as often
//! while everyone is waiting); a request whose 50 ms deadline passes while it
//! waits leaves the queue with an error instead of running late.

use std::time::Duration;

use admission::{AdmitError, Priority, TenantId, TenantWeight, WorkInfo, WorkQueue};
use tokio::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let queue = WorkQueue::new(2)?;
    queue.set_tenant_weight(TenantId::new(3), TenantWeight::new(2)?)?;
    let start = Instant::now();

    let requests = [
        (1, Priority::NORMAL, None),
        (1, Priority::BULK_NORMAL, None),
        (1, Priority::USER_HIGH, None),
        (2, Priority::NORMAL, None),
        (2, Priority::NORMAL, Some(Duration::from_millis(50))),
        (2, Priority::BULK_LOW, None),
        (3, Priority::NORMAL, None),
        (3, Priority::NORMAL, None),
        (3, Priority::NORMAL, None),
        (3, Priority::NORMAL, None),
    ];

    let mut handlers = Vec::new();
    for (n, (tenant, priority, timeout)) in requests.into_iter().enumerate() {
        let queue = queue.clone();
        handlers.push(tokio::spawn(async move {
            let mut work = WorkInfo::builder()
                .tenant(TenantId::new(tenant))
                .priority(priority);
            if let Some(timeout) = timeout {
                work = work.timeout(timeout);
            }
            let label = format!("request {n:>2} (tenant {tenant}, {priority:>11})");
            match queue.admit(work.build()).await {
                Ok(permit) => {
                    let at = start.elapsed().as_millis();
                    println!("{at:>4} ms  {label}  admitted");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    drop(permit);
                }
                Err(AdmitError::DeadlineExceeded { waited }) => {
                    let at = start.elapsed().as_millis();
                    println!(
                        "{at:>4} ms  {label}  gave up after waiting {} ms",
                        waited.as_millis()
                    );
                }
                Err(other) => println!("{label}  failed: {other}"),
            }
        }));
        // Let each handler reach the queue before the next is spawned, so
        // arrival order is the listing order.
        tokio::task::yield_now().await;
    }
    for handler in handlers {
        handler.await?;
    }

    let snapshot = queue.snapshot();
    println!("\nper priority: requested / admitted / errored, p99 wait bound");
    for p in &snapshot.priorities {
        println!(
            "  {:>14}: {} / {} / {}, {:?}",
            p.priority,
            p.requested,
            p.admitted,
            p.errored,
            p.wait.quantile(0.99).unwrap_or_default()
        );
    }
    println!(
        "slots: {} used of {}",
        snapshot.granter.used, snapshot.granter.total
    );
    Ok(())
}
