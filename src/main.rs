//! The `inhook` binary: parse the command line, run the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = inhook::cli::Cli::parse();
    match inhook::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("inhook: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
