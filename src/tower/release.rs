//! The admitted request's slot, reachable from its handler: so that a
//! handler behind [`AdmissionLayer`](super::AdmissionLayer) can give it back
//! while it waits on IO ([`release_during`]), to waiting work of a higher
//! priority between chunks of long work ([`give_way`]), or for good once
//! only waiting is left ([`release_slot`]).
//!
//! The response future runs the inner call holding the permit in a
//! [`Hold`], which gives the slot back by itself while the handler waits
//! (see [`SlotPermit::run`]), and makes that hold reachable from the
//! handler through a task-local: the handler runs inside that scope, so it
//! can take the permit out for an explicit wait and put the one it is
//! granted again back, and the response future returns whatever the hold
//! has when the inner call completes (or when it is dropped itself).

use std::future::{Future, IntoFuture};

use tokio::task::futures::TaskLocalFuture;

use crate::error::AdmitError;
use crate::queue::{Hold, Run, SlotPermit};
use crate::sync::StdArc;

tokio::task_local! {
    static HELD: StdArc<Hold>;
}

/// Runs `inner` holding `permit`, reachable from `inner` as the slot its
/// task holds.
pub(super) fn holding<F: Future>(
    permit: SlotPermit,
    inner: F,
) -> TaskLocalFuture<StdArc<Hold>, Run<F>> {
    let hold = Hold::new(permit);
    HELD.scope(hold.clone(), Run::with_hold(hold, inner))
}

/// Gives the slot of the request this task is serving back while `wait`
/// runs, then asks for it again: the tower counterpart of
/// [`SlotPermit::release_during`], for handlers behind
/// [`AdmissionLayer`](super::AdmissionLayer), which holds the permit itself.
///
/// The second admission is the request's own `WorkInfo` again (its tenant,
/// priority, create time and deadline), ordered and refused as any
/// admission is. The wait's output always comes back; beside it, `Ok(())`
/// once the slot is held again, or the refusal, after which the request
/// holds no slot and the handler should answer as a refused request would
/// (a 503, say). Outside a request admitted by the layer (in a task the
/// handler spawned, or with no layer at all), or while another
/// `release_during` of the same request has the slot, there is nothing to
/// give back: `wait` simply runs and `Ok(())` comes back.
///
/// # Cancel safety
///
/// Dropping the future drops `wait`; the slot was given back when it started,
/// and a request for it again leaves the queue.
///
/// # Errors
///
/// The second value is the [`AdmitError`] that refused the slot when `wait` had
/// finished (the request's deadline, a closed queue); the request then holds no
/// slot.
///
/// # Examples
///
/// ```
/// # async fn query() -> Vec<u32> { vec![1, 2, 3] }
/// # async fn handler() -> Result<String, admission::AdmitError> {
/// let (rows, admitted) = admission::tower::release_during(query()).await;
/// admitted?; // refused after the wait: answer as a refusal
/// Ok(format!("{} rows", rows.len()))
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap()
/// #     .block_on(async { assert_eq!(handler().await.unwrap(), "3 rows") });
/// ```
pub async fn release_during<F: IntoFuture>(wait: F) -> (F::Output, Result<(), AdmitError>) {
    let Some(permit) = take_held() else {
        return (wait.await, Ok(()));
    };
    let (output, again) = permit.release_during(wait).await;
    match again {
        Ok(permit) => {
            // Back in the hold, so that the response future returns it when
            // the call completes. The scope is the one `take` ran in: this
            // future is polled only inside the inner call.
            put_held(permit);
            (output, Ok(()))
        }
        Err(error) => (output, Err(error)),
    }
}

/// Offers the slot of the request this task is serving to waiting work of
/// a higher priority, and waits for it again if it was taken: the tower
/// counterpart of [`SlotPermit::give_way`], a preemption point for a
/// handler behind [`AdmissionLayer`](super::AdmissionLayer) that computes
/// for long (an export, a report), to call between its chunks.
///
/// `Ok(())` once the request holds its slot again (at once, when nobody of
/// a higher priority waits), or the refusal of asking again (its deadline),
/// after which the request holds no slot and the handler should answer as a
/// refused request would. Outside a request admitted by the layer, or while
/// [`release_during`] has the slot, there is nothing to offer: `Ok(())`.
///
/// # Cancel safety
///
/// Dropping the future while the slot is given away leaves the queue; the
/// request then holds no slot, as after a refusal.
///
/// # Errors
///
/// The [`AdmitError`] that refused the slot when the request asked for it again
/// (its deadline, a closed queue).
///
/// # Examples
///
/// ```
/// # async fn export_batch(_: u32) {}
/// # async fn handler() -> Result<(), admission::AdmitError> {
/// for batch in 0..10 {
///     export_batch(batch).await;
///     admission::tower::give_way().await?;
/// }
/// # Ok(())
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap()
/// #     .block_on(async { handler().await.unwrap() });
/// ```
pub async fn give_way() -> Result<(), AdmitError> {
    let Some(permit) = take_held() else {
        return Ok(());
    };
    let permit = permit.give_way().await?;
    // Back in the hold, in the scope `take_held` ran in (see
    // `release_during`).
    put_held(permit);
    Ok(())
}

/// Gives the slot of the request this task is serving back for good: for a
/// handler whose computation is done and whose remaining time is a wait (a
/// call to another service whose answer it passes on, a response it streams
/// out), which a slot would only hold idle. Returns whether the request held
/// one: `false` outside a request admitted by the layer, after an earlier
/// call, or while [`release_during`] has it.
///
/// Unlike [`release_during`], nothing asks for the slot again, so nothing
/// can refuse the request afterwards.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // Outside a request admitted by the layer there is no slot to give back.
/// assert!(!admission::tower::release_slot());
/// # });
/// ```
pub fn release_slot() -> bool {
    take_held().is_some()
}

/// The permit of the request this task is serving, out of its hold; `None`
/// outside the layer's scope, while the hold has given the slot back for a
/// wait, or when it is out already (a second call joined beside a
/// `release_during` finds it empty).
pub(super) fn take_held() -> Option<SlotPermit> {
    HELD.try_with(|hold| hold.take_permit()).ok().flatten()
}

/// Puts a permit asked for again back in the hold it was taken from
/// (outside that scope, which only `take_held`'s caller could be, the
/// closure and the permit in it are dropped, which returns the slot).
pub(super) fn put_held(permit: SlotPermit) {
    let _ = HELD.try_with(move |hold| hold.put_permit(permit));
}
