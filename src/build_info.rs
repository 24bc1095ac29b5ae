//! What the binary was built from: its version and git commit. A leaf:
//! `--version` (settings) and `tollgate_build_info` (metrics) read it.

/// The version, as Cargo.toml says it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (`unknown` without git).
pub const COMMIT: &str = env!("BUILD_COMMIT");
/// `--version`'s text: the version and the commit.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_COMMIT"),
    ")"
);
