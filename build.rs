//! Generates the Rust types of `proto/`: the rate limit configuration
//! resource an xDS server sends (envoyproxy/ratelimit's `RateLimitConfig`).
//! `google.protobuf` types are envoy-types' own, so one `Struct` type serves
//! both.

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
