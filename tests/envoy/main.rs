//! Through real Envoys and the control planes around Tollgate: Envoy and Istio end to end, Envoy Gateway's deployment, TLS, tracing, rules over xDS, budgets, the quota service (its Envoy timelines are the slow group: `cargo test --test envoy -- --ignored`), and the binary run as `ratelimit`.
//!
//! One test binary per area, sharing `tests/common`: each former test file
//! is a module here.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod answers;
mod envoy_e2e;
mod envoy_gateway;
mod held;
mod istio_e2e;
mod llm_budget;
mod reference_binary;
mod rlqs;
mod rlqs_hostile;
mod tls;
mod tracing;
mod xds;
