//! The `inhook` binary: parse the command line, run the library.

use clap::Parser;

/// mimalloc: glibc's malloc and free were a large share of the instructions per
/// delivery (docs/benchmarks.md, mimalloc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = inhook_server::cli::Cli::parse();
    match inhook_server::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("inhook: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
