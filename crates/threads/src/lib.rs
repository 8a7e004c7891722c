//! Threads that a PostgreSQL backend may start. PostgreSQL directs SIGINT (cancel), SIGTERM, SIGUSR1 (latch,
//! procsignal) and SIGALRM (timeouts) at the process; the kernel delivers such a signal to any thread that
//! does not block it, and PostgreSQL's handlers only work on the backend's main thread. So every thread the
//! extension starts, in any of its crates, is started through here with all signals blocked: it inherits
//! that mask, and the main thread keeps receiving every signal.
use std::io;
use std::thread::{Builder, JoinHandle};

/// Runs `spawn` with every signal blocked on the calling thread, so any thread it starts inherits a mask
/// that blocks everything; the calling thread's own mask is restored before returning.
#[cfg(unix)]
pub fn with_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    // SAFETY: sigfillset and pthread_sigmask only write the sigset_t values passed to them, which live on
    // this stack frame; the previous mask is restored before returning, on this same thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous) == 0;
        let result = spawn();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        }
        result
    }
}

#[cfg(not(unix))]
pub fn with_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    spawn()
}

/// `std::thread::Builder::spawn` with every signal blocked in the new thread.
pub fn spawn<F, T>(builder: Builder, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    with_signals_blocked(|| builder.spawn(body))
}

/// `std::thread::Builder::spawn_scoped` with every signal blocked in the new thread.
pub fn spawn_scoped<'scope, 'env, F, T>(
    builder: Builder,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    body: F,
) -> io::Result<std::thread::ScopedJoinHandle<'scope, T>>
where
    F: FnOnce() -> T + Send + 'scope,
    T: Send + 'scope,
{
    with_signals_blocked(|| builder.spawn_scoped(scope, body))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn blocked_signals_of_this_thread() -> libc::sigset_t {
        // SAFETY: queries the current thread's mask into a local.
        unsafe {
            let mut current: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut current);
            current
        }
    }

    fn is_blocked(set: &libc::sigset_t, signal: i32) -> bool {
        // SAFETY: reads a sigset_t that lives for the call.
        unsafe { libc::sigismember(set, signal) == 1 }
    }

    #[test]
    fn spawned_threads_block_postgres_signals_and_the_caller_keeps_its_mask() {
        let before = blocked_signals_of_this_thread();
        let child = spawn(Builder::new(), || {
            let mask = blocked_signals_of_this_thread();
            [
                libc::SIGINT,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGALRM,
                libc::SIGHUP,
            ]
            .iter()
            .all(|&signal| is_blocked(&mask, signal))
        })
        .expect("thread starts")
        .join()
        .expect("thread ends");
        assert!(child, "the new thread blocks every signal PostgreSQL sends");
        let after = blocked_signals_of_this_thread();
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGALRM] {
            assert_eq!(is_blocked(&before, signal), is_blocked(&after, signal));
        }
    }

    #[test]
    fn scoped_threads_are_blocked_too() {
        let all_blocked = std::thread::scope(|scope| {
            spawn_scoped(Builder::new(), scope, || {
                is_blocked(&blocked_signals_of_this_thread(), libc::SIGINT)
            })
            .expect("thread starts")
            .join()
            .expect("thread ends")
        });
        assert!(all_blocked);
    }
}
