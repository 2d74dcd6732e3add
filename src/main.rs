//! The `pinlb` command: argument parsing only; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pinlb::{Config, Server};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "pinlb",
    version,
    about = "A pinned, TOML-configured HTTP/1.1 load balancer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Validate a configuration file and print the resolved plan (exit 0 if valid, 1 if not).
    Check {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(c) => {
                print!("{}", c.describe());
                println!("{}: configuration is valid", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve { config } => {
            let c = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = Server::bind(c).and_then(|s| s.run(shutdown_signal()));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pinlb: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!("cannot listen for signals ({e}); stop pinlb with SIGKILL");
            std::future::pending::<()>().await
        }
    }
}

// glibc malloc showed up in request-path profiles; mimalloc's per-thread heaps suit one runtime per
// core, where every allocation is freed on the thread that made it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
