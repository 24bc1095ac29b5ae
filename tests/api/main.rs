//! The gRPC and admin API, rule files and their compatibility with envoyproxy/ratelimit, bounds against hostile clients, time zones, the fuzz corpus: black-box against a real `tollgate serve` where the process matters, in process otherwise.
//!
//! One test binary per area, sharing `tests/common`: each former test file
//! is a module here.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod answers;
mod compat;
mod fuzz_corpus;
mod grpc;
mod hardening;
mod papercuts;
mod protocol;
mod time_zones;
mod vendored_h2;
