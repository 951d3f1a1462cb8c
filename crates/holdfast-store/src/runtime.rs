//! [`Runtime`]: openraft's tokio runtime with a random source a simulation can seed.
//!
//! openraft draws each election timeout from [`AsyncRuntime::thread_rng`]. With
//! [`openraft::TokioRuntime`] that is `rand::thread_rng()`, seeded from the OS, so a simulation that
//! replays a seed still sees different elections. [`Runtime`] is `TokioRuntime` in every other respect
//! (each associated type and function is `TokioRuntime`'s); its random source is a generator seeded by
//! [`seed_thread_rng`] on the calling thread, and `rand::thread_rng()` on threads nobody seeded, as in
//! production.

use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// openraft's async runtime for holdfast: tokio, with a seedable random source (see the module docs).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runtime;

thread_local! {
    /// This thread's seeded generator; `None` until [`seed_thread_rng`] is called on it.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes every draw from [`Runtime`]'s random source on this thread come from a generator seeded with
/// `seed`, from now on: two threads seeded alike draw the same numbers. Seeding again restarts the
/// sequence. A simulation calls this on its thread before it builds a cluster.
pub fn seed_thread_rng(seed: u64) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// [`Runtime`]'s random source: each draw comes from the calling thread's seeded generator if
/// [`seed_thread_rng`] was called on the thread, else from `rand::thread_rng()`.
///
/// Like `rand::rngs::ThreadRng`, it stays on the thread that made it (it is neither `Send` nor `Sync`).
#[derive(Debug, Clone, Default)]
pub struct RuntimeRng {
    _not_send: PhantomData<*const ()>,
}

impl RuntimeRng {
    fn draw<T>(&mut self, f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(rng) => f(rng),
            None => f(&mut rand::thread_rng()),
        })
    }
}

impl RngCore for RuntimeRng {
    fn next_u32(&mut self) -> u32 {
        self.draw(|rng| rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        self.draw(|rng| rng.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.draw(|rng| rng.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.draw(|rng| rng.try_fill_bytes(dest))
    }
}

impl AsyncRuntime for Runtime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = RuntimeRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        RuntimeRng::default()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

/// Runs `work`, which blocks its thread for longer than a task should (a log truncation or purge: files
/// deleted, a segment cut and synced; a snapshot serialized or decoded), from async code: on a
/// multi-threaded tokio runtime through `block_in_place` (the worker hands its other tasks to another
/// thread first, so the node goes on answering), elsewhere (a single-threaded test or simulation runtime)
/// in place.
pub(crate) fn blocking<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    /// 16 election timeouts drawn the way openraft draws them, on a new thread seeded with `seed`.
    fn timeouts_on_new_thread(seed: Option<u64>) -> Vec<u64> {
        std::thread::spawn(move || {
            if let Some(seed) = seed {
                seed_thread_rng(seed);
            }
            (0..16).map(|_| Runtime::thread_rng().gen_range(150..300)).collect()
        })
        .join()
        .expect("the drawing thread does not panic")
    }

    #[test]
    fn threads_seeded_alike_draw_the_same_sequence() {
        let first = timeouts_on_new_thread(Some(7));
        assert_eq!(first, timeouts_on_new_thread(Some(7)));
        assert_ne!(first, timeouts_on_new_thread(Some(8)), "another seed, another sequence");
        assert!(first.iter().all(|t| (150..300).contains(t)));
    }

    #[test]
    fn seeding_again_restarts_the_sequence() {
        seed_thread_rng(11);
        let first: Vec<u64> = (0..8).map(|_| Runtime::thread_rng().next_u64()).collect();
        seed_thread_rng(11);
        let again: Vec<u64> = (0..8).map(|_| Runtime::thread_rng().next_u64()).collect();
        assert_eq!(first, again);
        // Each draw moves the one generator on, whichever `RuntimeRng` value draws.
        assert_ne!(first[0], first[1]);
    }

    #[test]
    fn unseeded_threads_draw_from_thread_rng() {
        // Two unseeded threads drawing 16 u64s alike would be a 2^-1024 coincidence.
        let draw = || {
            std::thread::spawn(|| (0..16).map(|_| Runtime::thread_rng().next_u64()).collect::<Vec<_>>())
                .join()
                .expect("the drawing thread does not panic")
        };
        assert_ne!(draw(), draw());
    }
}
