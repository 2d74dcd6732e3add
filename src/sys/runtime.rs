//! The single-threaded tokio runtimes pinlb's threads run on. A worker, a bench load thread and a
//! test backend each pin their thread to its core before building one ([`pinned`]); the control
//! thread builds its own ([`current_thread`]) before the configuration's cores are pinned, so
//! that signals are registered on it before any socket is bound.

use std::io;

use tokio::runtime::Runtime;

use super::cpus::pin_current_thread;

/// A current-thread runtime with every driver on (I/O, time, signals).
pub(crate) fn current_thread() -> io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Why [`pinned`] could not give a runtime; each caller names the thread in its own error.
#[derive(Debug)]
pub(crate) enum PinnedError {
    /// The thread could not be pinned to the core (no runtime was built).
    Pin(nix::Error),
    /// The thread is pinned, but its runtime could not be built.
    Runtime(io::Error),
}

/// Pins the calling thread to `core`, then builds its [`current_thread`] runtime, on which the
/// caller runs the thread's tasks (on a `LocalSet` where they are not `Send`).
pub(crate) fn pinned(core: usize) -> Result<Runtime, PinnedError> {
    pin_current_thread(&[core]).map_err(PinnedError::Pin)?;
    current_thread().map_err(PinnedError::Runtime)
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
    fn a_core_outside_the_machine_fails_the_pin() {
        let outside = nix::sched::CpuSet::count();
        assert!(matches!(pinned(outside), Err(PinnedError::Pin(_))));
    }
}
