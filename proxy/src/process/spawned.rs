//! Spawned backends as the rest of pinlb sees them: one [`Record`] per process that
//! `[upstream.NAME.spawn]` asks for (its pid, port, core, state and restarts), which the
//! supervisor keeps and `/status` and `/metrics` read; and [`Backoff`], the pure rule for how
//! long a process that exited waits before it is started again.
//!
//! The processes themselves are started, watched, rolled and stopped by `supervisor`.

use std::sync::Mutex;
use std::time::Duration;

/// Where a spawned process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Started; not in the pool until it answers.
    Starting,
    /// Answered: in the pool, taking requests.
    Ready,
    /// Out of the pool; its requests in flight finish, then it gets SIGTERM.
    Stopping,
    /// Exited (or never answered); started again after its backoff.
    Waiting,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Stopping => "stopping",
            State::Waiting => "waiting",
        }
    }
}

/// One spawned process, by upstream and index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub upstream: String,
    /// `i` of `count`: the same across restarts and rolling restarts.
    pub index: usize,
    /// The running process's; `None` while it waits to be started again.
    pub pid: Option<u32>,
    /// Its port, or its socket with `{socket}`.
    pub address: crate::backend_address::BackendAddress,
    pub core: usize,
    pub state: State,
    /// Times the process exited (or failed to start) and was started again. A rolling restart
    /// is not counted: it was asked for.
    pub restarts: u64,
    /// How the last process at this index ended, as `wait` told it ("exit status: 1",
    /// "signal: 9 (SIGKILL)").
    pub last_exit: Option<String>,
}

/// Every spawned process's record. A std mutex: the supervisor and the admin listener hold it
/// only to copy or replace a record, and nothing awaits while it is held; the request path
/// never takes it.
#[derive(Debug, Default)]
pub struct Spawned(Mutex<Vec<Record>>);

impl Spawned {
    /// A copy of every record, by upstream then index.
    pub fn all(&self) -> Vec<Record> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_by(|a, b| (&a.upstream, a.index).cmp(&(&b.upstream, b.index)));
        v
    }

    /// Stores `record`, replacing the one with its upstream and index.
    pub fn set(&self, record: Record) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match all
            .iter_mut()
            .find(|r| r.upstream == record.upstream && r.index == record.index)
        {
            Some(r) => *r = record,
            None => all.push(record),
        }
    }

    /// Forgets the records of `upstream` from `index` on (its processes were stopped).
    pub fn remove(&self, upstream: &str, from: usize) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|r| r.upstream != upstream || r.index < from);
    }
}

/// Exponential backoff between restarts, as systemd's `RestartSec` with
/// `RestartSteps`/`RestartMaxDelaySec`: the first restart comes after [`Backoff::FIRST`], each
/// following one after twice the last, up to [`Backoff::MAX`]; a process that ran for
/// [`Backoff::STABLE`] before it exited starts over at the first delay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the last restart; `None` before the first.
    last: Option<Duration>,
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_millis(100);
    pub const MAX: Duration = Duration::from_secs(30);
    pub const STABLE: Duration = Duration::from_secs(10);

    /// The wait before starting again a process that exited after running `ran`.
    pub fn next(&mut self, ran: Duration) -> Duration {
        let delay = match self.last {
            Some(last) if ran < Self::STABLE => (last * 2).min(Self::MAX),
            _ => Self::FIRST,
        };
        self.last = Some(delay);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(5);
        let delays: Vec<u128> = (0..11).map(|_| b.next(quick).as_millis()).collect();
        assert_eq!(
            delays,
            [
                100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000
            ]
        );
        assert_eq!(b.next(Backoff::STABLE), Backoff::FIRST);
        assert_eq!(b.next(quick), Duration::from_millis(200));
    }

    #[test]
    fn a_record_is_replaced_by_upstream_and_index() {
        let s = Spawned::default();
        let r = |index, restarts| Record {
            upstream: "app".into(),
            index,
            pid: Some(1),
            address: "127.0.0.1:9000".parse().unwrap(),
            core: 0,
            state: State::Ready,
            restarts,
            last_exit: None,
        };
        s.set(r(1, 0));
        s.set(r(0, 0));
        s.set(r(1, 3));
        let all = s.all();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].index, all[1].index, all[1].restarts), (0, 1, 3));
        s.remove("app", 1);
        assert_eq!(s.all().len(), 1);
    }
}
