//! Records the git commit the binary is built from (`BUILD_COMMIT`, for
//! `--version` and `tollgate_build_info`), and generates the Rust types of
//! `proto/`: the rate limit configuration
//! resource an xDS server sends (envoyproxy/ratelimit's `RateLimitConfig`).
//! `google.protobuf` types are envoy-types' own, so one `Struct` type serves
//! both.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    commit();
    let proto = "proto/ratelimit/config/ratelimit/v3/rls_conf.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new()
        .extern_path(
            ".google.protobuf.Struct",
            "::envoy_types::pb::google::protobuf::Struct",
        )
        .compile_fds(descriptors)?;
    Ok(())
}

/// `BUILD_COMMIT` for the compiler: `GIT_COMMIT` from the environment (an
/// image build without `.git` passes it), else `git rev-parse`, else
/// `unknown`. Rebuilt when HEAD moves. (Not a `TOLLGATE_` name: Cargo
/// passes it to test processes too, and Tollgate refuses `TOLLGATE_`
/// variables it does not know.)
fn commit() {
    println!("cargo:rerun-if-env-changed=GIT_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(branch) = head.trim().strip_prefix("ref: ")
    {
        println!("cargo:rerun-if-changed=.git/{branch}");
        println!("cargo:rerun-if-changed=.git/packed-refs");
    }
    let commit = std::env::var("GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        })
        .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_COMMIT={commit}");
}
