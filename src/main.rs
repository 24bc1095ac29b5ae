//! The `tollgate` binary: settings from the command line and the
//! environment, then the subcommand (`tollgate::main`).

use std::process::ExitCode;

fn main() -> ExitCode {
    tollgate::main(std::env::args_os(), &tollgate::Env::process())
}

// glibc's malloc showed up at ~10% of a request's CPU time; mimalloc's
// per-thread free lists suit one runtime per core.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
