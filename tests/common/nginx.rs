//! nginx as a peer in the tests: run on a configuration the test writes, in a directory of its
//! own, in the foreground (no master process), and killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// nginx as a child process, killed when dropped.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Nginx {
    pub fn binary() -> PathBuf {
        for p in [
            "/usr/sbin/nginx",
            "/usr/local/sbin/nginx",
            "/usr/local/nginx/sbin/nginx",
        ] {
            if Path::new(p).exists() {
                return p.into();
            }
        }
        let found = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("nginx"))
                .find(|p| p.exists())
        });
        found.unwrap_or_else(|| panic!("nginx not found: install nginx (scripts/test does)"))
    }

    pub fn start(dir: &Path, config: &str) -> Nginx {
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let file = dir.join("nginx.conf");
        std::fs::write(&file, config).unwrap();
        let globals = format!(
            "daemon off; master_process off; pid {}; error_log {} info;",
            dir.join("nginx.pid").display(),
            dir.join("error.log").display()
        );
        let child = Command::new(Nginx::binary())
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&file)
            .arg("-g")
            .arg(globals)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // What nginx says before it has read error_log (a config error) goes here.
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("start nginx");
        Nginx {
            child,
            dir: dir.to_path_buf(),
        }
    }

    pub fn log(&self) -> String {
        ["stderr.log", "error.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
