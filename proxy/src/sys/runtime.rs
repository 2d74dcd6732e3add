//! The single-threaded tokio runtimes pinlb's threads run on. A worker, a bench load thread and a
//! test backend each pin their thread to its core before building one ([`pinned`]); the control
//! thread builds its own ([`current_thread`]) before the configuration's cores are pinned, so
//! that signals are registered on it before any socket is bound.
//!
//! A pinned thread's runtime is a [`LocalRuntime`]: its tasks are not `Send` (they share `Rc`s
//! and `RefCell`s, with no lock), and `spawn_local` puts them straight on the runtime's own run
//! queue. A `LocalSet` on a `Runtime` did the same one layer further out: each wakeup of a task
//! went to the set's queue, woke the set, and the runtime polled the set, which polled the task.
//! That layer cost about 330 user-space instructions per wakeup, and a proxied request has two
//! (`benches/callgrind.sh`).

use std::io;

use tokio::runtime::{LocalOptions, LocalRuntime, Runtime};

use super::cpus::pin_current_thread;

/// A current-thread runtime with every driver on (I/O, time, signals).
pub fn current_thread() -> io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Why [`pinned`] could not give a runtime; each caller names the thread in its own error.
#[derive(Debug)]
pub enum PinnedError {
    /// The thread could not be pinned to the core (no runtime was built).
    Pin(nix::Error),
    /// The thread is pinned, but its runtime could not be built.
    Runtime(io::Error),
}

/// Pins the calling thread to `core`, then builds its runtime: a current-thread [`LocalRuntime`]
/// with every driver on, whose `block_on` and `spawn_local` run the thread's tasks.
pub fn pinned(core: usize) -> Result<LocalRuntime, PinnedError> {
    pin_current_thread(&[core]).map_err(PinnedError::Pin)?;
    local().map_err(PinnedError::Runtime)
}

/// A current-thread [`LocalRuntime`] with every driver on, for a thread that stays where it is.
pub fn local() -> io::Result<LocalRuntime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(LocalOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_runs_on_the_core_it_was_given() {
        let core = super::super::cpus::allowed_cpus().unwrap()[0];
        let on = std::thread::spawn(move || {
            let rt = pinned(core).unwrap();
            rt.block_on(async { super::super::cpus::allowed_cpus().unwrap() })
        })
        .join()
        .unwrap();
        assert_eq!(on, vec![core]);
    }

    #[test]
    fn a_pinned_runtime_runs_tasks_that_are_not_send() {
        let core = super::super::cpus::allowed_cpus().unwrap()[0];
        let rt = pinned(core).unwrap();
        let shared = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = shared.clone();
        let got = rt.block_on(async move {
            let task = tokio::task::spawn_local(async move {
                tokio::task::yield_now().await;
                seen.set(seen.get() + 1);
                seen.get()
            });
            task.await.unwrap()
        });
        assert_eq!((got, shared.get()), (1, 1));
    }

    #[test]
    fn a_core_outside_the_machine_fails_the_pin() {
        let outside = nix::sched::CpuSet::count();
        assert!(matches!(pinned(outside), Err(PinnedError::Pin(_))));
    }
}
