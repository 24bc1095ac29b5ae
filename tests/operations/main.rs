//! Operating and shipping Tollgate: metrics, the admin port in a real browser, candidate rules, the simulator, the Kubernetes manifests, the docs that must run as written, the layering of `src/`, and the image (`-- --ignored image::`, after scripts/image.sh builds it).
//!
//! One test binary per area, sharing `tests/common`: each former test file
//! is a module here.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod admin_browser;
mod admin_tokens;
mod candidate;
mod docs;
mod durable;
mod durable_faults;
mod image;
mod layers;
mod limited;
mod manifests;
mod operations;
mod resets;
mod scrapes;
mod shared_views;
mod simulate;
mod view_flood;
