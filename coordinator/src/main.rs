//! The `coordinator` binary: parses flags, runs, prints one clear line on error.

use clap::Parser;

fn main() {
    let cli = charm_coordinator::cli::Cli::parse();
    if let Err(e) = charm_coordinator::cli::run(cli) {
        eprintln!("error: {}", charm_common::error::one_line(e.chain()));
        std::process::exit(1);
    }
}
