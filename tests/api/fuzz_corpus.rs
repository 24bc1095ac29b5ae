//! Replays every fuzz target's saved corpus and every crash the fuzzers
//! found (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) through the
//! same harness the fuzzers run, on the stable toolchain. The long campaign
//! is `scripts/fuzz.sh`.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

#[path = "../../fuzz/harness.rs"]
mod harness;

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).expect("read input");
            let name = entry.path().display().to_string();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{name} breaks {target}");
            inputs += 1;
        }
    }
    assert!(inputs > 0, "fuzz/corpus/{target} holds the seed corpus");
}

#[test]
fn rules_file() {
    replay("rules_file", harness::rules_file);
}

#[test]
fn request_bytes() {
    replay("request_bytes", harness::request_bytes);
}

#[test]
fn json_body() {
    replay("json_body", harness::json_body);
}

#[test]
fn request_sequence() {
    replay("request_sequence", harness::request_sequence);
}
