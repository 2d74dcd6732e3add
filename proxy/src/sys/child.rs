//! Child processes pinlb starts (spawned backends, `pinlb sweep`'s layouts): pinned to their
//! cores before they run, and sent `SIGKILL` by the kernel when the thread that started them dies,
//! so no child outlives pinlb, even a pinlb killed with `SIGKILL`.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};

/// Makes `command` run pinned to `cpus` and die with its parent, with the soft open file limit
/// pinlb started with (see [`crate::sys::limits::raise_nofile`]).
///
/// The affinity is set in the child between `fork` and `exec`, so the program's first instruction
/// already runs on its cores (`taskset` does the same). `PR_SET_PDEATHSIG` follows the *thread*
/// that forks, not the process: call `spawn` from a thread that lives as long as pinlb does (the
/// control thread, or `main`), never from a short-lived helper thread.
///
/// # Errors
///
/// A core that `CpuSet` can't hold (beyond `CpuSet::count()`).
pub fn pinned<'a>(command: &'a mut Command, cpus: &[usize]) -> Result<&'a mut Command, nix::Error> {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    let parent = nix::unistd::getpid();
    let nofile = crate::sys::limits::original_soft_nofile();
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (sched_setaffinity, getrlimit, setrlimit, prctl, getppid), which are async-signal-safe;
    // it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            sched_setaffinity(Pid::from_raw(0), &set)?;
            if let Some(soft) = nofile {
                let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
                setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard), hard)?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died between fork and prctl: then no signal will come.
            if getppid() != parent {
                return Err(std::io::Error::other(
                    "pinlb exited while starting this process",
                ));
            }
            Ok(())
        });
    }
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_runs_on_the_cores_it_was_given() {
        let core = *crate::sys::cpus::allowed_cpus().unwrap().last().unwrap();
        let mut command = Command::new("grep");
        command.args(["Cpus_allowed_list", "/proc/self/status"]);
        let out = pinned(&mut command, &[core]).unwrap().output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.split_whitespace().last(),
            Some(core.to_string().as_str())
        );
    }

    #[test]
    fn the_child_gets_the_soft_open_file_limit_pinlb_started_with() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert!(
            hard > 1024,
            "needs a hard open file limit above 1024, have {hard}"
        );
        // As under systemd: a soft limit of 1024, raised at start.
        setrlimit(Resource::RLIMIT_NOFILE, 1024, hard).unwrap();
        let raised = crate::sys::limits::raise_nofile().unwrap();
        assert_eq!(raised.soft, crate::sys::limits::nofile().unwrap().hard);
        let core = crate::sys::cpus::allowed_cpus().unwrap()[0];
        let mut command = Command::new("sh");
        command.args(["-c", "ulimit -Sn"]);
        let out = pinned(&mut command, &[core]).unwrap().output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1024");
    }

    #[test]
    fn the_child_is_killed_when_the_thread_that_started_it_ends() {
        use std::os::unix::process::ExitStatusExt;
        let core = crate::sys::cpus::allowed_cpus().unwrap()[0];
        // A thread that starts the child and ends: the kernel's parent-death signal fires then
        // (it follows the forking thread), as it would when pinlb itself dies.
        let mut child = std::thread::spawn(move || {
            let mut command = Command::new("sleep");
            command.arg("30");
            pinned(&mut command, &[core]).unwrap().spawn().unwrap()
        })
        .join()
        .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status:?}");
    }
}
