//! The `shardlane` binary: the command line ([`shardlane::Cli`]) parsed
//! and run. Every command, and the start-up they share, lives in the
//! library's `commands` module; an error prints as one line and exits
//! non-zero.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    shardlane::Cli::parse().run()
}
