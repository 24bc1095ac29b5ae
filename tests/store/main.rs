//! The stores: one conformance suite on the memory store, a real Redis and a real Redis Cluster; the memory store against Redis on generated traffic; Redis, Sentinel and Cluster faults, configuration and batching.
//!
//! One test binary per area, sharing `tests/common`: each former test file
//! is a module here.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]
// Deep async tests overflow the trait solver's default depth (E0275).
#![recursion_limit = "256"]

#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod differential;
mod held;
mod held_outages;
mod lanes;
mod redis_batching;
mod redis_cluster_faults;
mod redis_config;
mod redis_faults;
mod redis_sentinel;
mod redis_store;
mod sliding_log;
