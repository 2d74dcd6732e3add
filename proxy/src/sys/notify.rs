//! systemd's readiness protocol (`Type=notify`, sd_notify(3)): what pinlb tells the service
//! manager, and when. Nothing is sent unless `$NOTIFY_SOCKET` is set, so outside systemd each
//! call is one environment lookup.
//!
//! - `READY=1` once every listener is bound and every worker accepts on it (and again once a
//!   reload is done);
//! - `RELOADING=1` with `MONOTONIC_USEC=` when a SIGHUP reload starts (what systemd 253's
//!   `Type=notify-reload` requires, and what older versions accept);
//! - `STOPPING=1` when a graceful stop starts;
//! - `MAINPID=` from the old process when `pinlb upgrade` hands over to a new one, so that
//!   systemd follows the new process (the old one is the main PID, which `NotifyAccess=main`
//!   lets send it);
//! - `STATUS=` lines that say what happened, for `systemctl status`.

use sd_notify::NotifyState;
use tracing::warn;

/// Listeners bound, workers accepting.
pub(crate) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(&one_line(status))]);
}

/// A reload starts; [`ready`] ends it.
pub(crate) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[
            NotifyState::Reloading,
            now,
            NotifyState::Status("reloading"),
        ]),
        Err(e) => warn!("systemd notify: cannot read the monotonic clock: {e}"),
    }
}

/// A graceful stop starts.
pub(crate) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// Hands the service over to the process `pid` (a binary upgrade).
pub(crate) fn main_pid(pid: u32, status: &str) {
    send(&[
        NotifyState::MainPid(pid),
        NotifyState::Status(&one_line(status)),
    ]);
}

/// `status` on one line: each line of the message is an assignment of its own, so a refused
/// reload's list of errors would otherwise end STATUS= at its first error.
fn one_line(status: &str) -> String {
    status.replace('\n', "; ")
}

/// A failure to tell systemd is logged, never fatal: pinlb serves either way, and systemd
/// times the start out on its own if READY never comes.
fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!("systemd notify failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_of_several_lines_is_sent_as_one() {
        assert_eq!(
            super::one_line("a: x\nb: y\n2 errors"),
            "a: x; b: y; 2 errors"
        );
    }
}
