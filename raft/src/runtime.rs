//! The async runtime openraft runs on, chosen at build time: tokio in production, madsim under `--cfg madsim`.
//!
//! openraft's own `TokioRuntime` cannot be used in simulation: it panics without a tokio reactor, and it draws
//! election jitter from `rand::thread_rng()`, which the simulator cannot intercept. This runtime routes spawning,
//! sleeping and timeouts through `tokio` (which is `madsim-tokio`, i.e. madsim's executor and clock, under
//! `--cfg madsim`) and draws randomness from a seeded generator: madsim's global one in simulation, a ChaCha stream
//! seeded once per thread from the OS in production.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant};

/// openraft's runtime for cellog.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CellRuntime;

/// A timeout that expired.
#[derive(Debug)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline elapsed")
    }
}

/// A sleep on the runtime's clock.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A future bounded by a deadline: the future is polled first, so one that is ready at the deadline wins.
pub struct Timeout<R, T> {
    future: Pin<Box<T>>,
    sleep: Sleep,
    output: PhantomData<fn() -> R>,
}

impl<R, T: Future<Output = R>> Future for Timeout<R, T> {
    type Output = Result<R, Elapsed>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The sender half of a one-shot channel.
pub struct OneshotSender<T>(tokio::sync::oneshot::Sender<T>);

impl<T> fmt::Debug for OneshotSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneshotSender")
    }
}

impl<T: OptionalSend> openraft::async_runtime::AsyncOneshotSendExt<T> for OneshotSender<T> {
    fn send(self, value: T) -> Result<(), T> {
        self.0.send(value)
    }
}

fn until(deadline: TokioInstant) -> Duration {
    deadline.saturating_duration_since(<TokioInstant as openraft::Instant>::now())
}

impl AsyncRuntime for CellRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = TokioInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<R, T>;
    type ThreadLocalRng = rng::LocalRng;
    type OneshotSender<T: OptionalSend> = OneshotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        sleep(until(deadline))
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        Timeout { future: Box::pin(future), sleep: sleep(duration), output: PhantomData }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        Self::timeout(until(deadline), future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        rng::LocalRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        (OneshotSender(sender), receiver)
    }
}

#[cfg(not(madsim))]
fn sleep(duration: Duration) -> Sleep {
    Box::pin(tokio::time::sleep(duration))
}

#[cfg(madsim)]
fn sleep(duration: Duration) -> Sleep {
    Box::pin(set_once::Sleep::new(duration))
}

#[cfg(madsim)]
#[allow(clippy::disallowed_methods, reason = "this is the runtime's clock: madsim's simulated one")]
mod set_once {
    //! A sleep whose timer is set once, when it is made, however often (or whether) it is polled.
    //!
    //! madsim sets a timer on every pending poll of its sleep, and timers due at one instant fire in an order that
    //! depends on every timer set before them. openraft waits out a backoff in a `tokio::select!` of a sleep and its
    //! event channel, whose branches are polled in an order drawn from tokio's per-thread generator; that generator is
    //! seeded from a process-wide counter no simulation can reset, so whether the sleep was polled (and set a timer)
    //! differed between two runs of one seed in one process, and so did what ran next. Written here, not taken from a
    //! crate, because it exists only to make the simulator's timers independent of polling order.

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use tokio::time::Instant;

    /// Where the timer's wake goes: the waker of the sleep's last poll, until the sleep is dropped.
    #[derive(Default)]
    struct Slot(Mutex<Option<Waker>>);

    impl Slot {
        fn put(&self, waker: Option<Waker>) -> Option<Waker> {
            std::mem::replace(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner), waker)
        }
    }

    impl Wake for Slot {
        fn wake(self: Arc<Self>) {
            if let Some(waker) = self.put(None) {
                waker.wake();
            }
        }
    }

    pub(super) struct Sleep {
        deadline: Instant,
        slot: Arc<Slot>,
    }

    impl Sleep {
        pub(super) fn new(duration: Duration) -> Sleep {
            let deadline = Instant::now() + duration;
            let slot = Arc::new(Slot::default());
            // One poll now sets the one timer; madsim keeps it (and the slot's waker) after its sleep is dropped.
            let waker = Waker::from(slot.clone());
            let _ = Box::pin(tokio::time::sleep_until(deadline)).as_mut().poll(&mut Context::from_waker(&waker));
            Sleep { deadline, slot }
        }
    }

    impl Future for Sleep {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if Instant::now() >= self.deadline {
                return Poll::Ready(());
            }
            self.slot.put(Some(cx.waker().clone()));
            Poll::Pending
        }
    }

    impl Drop for Sleep {
        /// A sleep dropped unfinished (the other branch of a select won) wakes nobody when its timer fires, polled
        /// before or not.
        fn drop(&mut self) {
            self.slot.put(None);
        }
    }
}

/// Runs blocking storage work (a write, an fsync, a scan of the log) on the runtime's blocking threads, so that an fsync
/// on a small machine does not hold up a worker that heartbeats and answers are waiting for. A panic in it goes on in
/// the caller. In simulation it runs in place: the disk is memory, and time is simulated.
pub(crate) async fn off_the_workers<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    #[cfg(not(madsim))]
    {
        match tokio::task::spawn_blocking(work).await {
            Ok(value) => value,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    #[cfg(madsim)]
    {
        work()
    }
}

/// A random number from the same seeded generator (a cell's id when it is founded).
pub(crate) fn random_u128() -> u128 {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rng::LocalRng.fill_bytes(&mut bytes);
    u128::from_le_bytes(bytes)
}

/// The key of this process's message-id indexes ([`cellog_core::IdKey`]), the same for every cell it hosts: drawn once
/// from the OS in production, so that no client can choose ids that collide in them. Fixed in simulation: a draw there
/// would shift every later draw of the run, and no one chooses ids against the simulator.
pub(crate) fn id_key() -> cellog_core::IdKey {
    #[cfg(not(madsim))]
    {
        use rand::{RngCore, SeedableRng};

        static KEY: std::sync::OnceLock<cellog_core::IdKey> = std::sync::OnceLock::new();
        *KEY.get_or_init(|| {
            let mut rng = rand_chacha::ChaCha8Rng::from_entropy();
            cellog_core::IdKey::new(rng.next_u64(), rng.next_u64())
        })
    }
    #[cfg(madsim)]
    {
        cellog_core::IdKey::new(0x7369_6d75_6c61_7465, 0x642d_6b65_792d_3031)
    }
}

mod rng {
    //! The randomness openraft asks for (election timeouts).

    use rand::RngCore;

    /// A handle on this thread's seeded generator.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct LocalRng;

    #[cfg(madsim)]
    fn with<R>(f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
        // madsim's generator is seeded from the simulation seed, so a run replays bit for bit.
        f(&mut madsim::rand::thread_rng())
    }

    #[cfg(not(madsim))]
    fn with<R>(f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
        use std::cell::RefCell;

        use rand::SeedableRng;
        use rand_chacha::ChaCha8Rng;

        thread_local! {
            // Production only needs jitter that differs between nodes; a stream seeded once from the OS gives that
            // without touching the OS on every draw.
            static GENERATOR: RefCell<ChaCha8Rng> = RefCell::new(ChaCha8Rng::from_entropy());
        }
        GENERATOR.with(|generator| f(&mut *generator.borrow_mut()))
    }

    impl RngCore for LocalRng {
        fn next_u32(&mut self) -> u32 {
            with(|rng| rng.next_u32())
        }

        fn next_u64(&mut self) -> u64 {
            with(|rng| rng.next_u64())
        }

        fn fill_bytes(&mut self, dest: &mut [u8]) {
            with(|rng| rng.fill_bytes(dest))
        }

        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
            with(|rng| rng.try_fill_bytes(dest))
        }
    }
}
