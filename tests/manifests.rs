//! The Kubernetes and Istio manifests in examples/kubernetes parse, have the
//! fields Kubernetes requires, and the rules in every ConfigMap pass
//! `tollgate check`. (No cluster runs here; this is what can be checked.)

use std::path::Path;
use std::process::Command;

fn documents(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("manifest");
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn manifests_parse_and_configmap_rules_pass_tollgate_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes");
    let mut kinds = Vec::new();
    let mut rule_files = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/kubernetes") {
        let path = entry.expect("entry").path();
        for doc in documents(&path) {
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: a document without kind", path.display()));
            assert!(
                doc["apiVersion"].is_string(),
                "{}: {kind} without apiVersion",
                path.display()
            );
            assert!(
                doc["metadata"]["name"].is_string(),
                "{}: {kind} without metadata.name",
                path.display()
            );
            kinds.push(kind.to_owned());
            if kind == "ConfigMap" {
                let tmp = tempfile::tempdir().expect("tempdir");
                let data = doc["data"].as_object().expect("ConfigMap data");
                for (name, text) in data {
                    std::fs::write(tmp.path().join(name), text.as_str().expect("text"))
                        .expect("write");
                    rule_files += 1;
                }
                let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                    .arg("check")
                    .arg(tmp.path())
                    .output()
                    .expect("tollgate check");
                assert!(
                    out.status.success(),
                    "{}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if kind == "Deployment" {
                let containers = doc["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .expect("containers");
                assert!(!containers.is_empty());
                let selector = &doc["spec"]["selector"]["matchLabels"];
                let labels = &doc["spec"]["template"]["metadata"]["labels"];
                assert_eq!(
                    selector,
                    labels,
                    "{}: selector must match the pod labels",
                    path.display()
                );
            }
            if kind == "EnvoyFilter" {
                let patches = doc["spec"]["configPatches"]
                    .as_array()
                    .expect("configPatches");
                assert!(!patches.is_empty());
            }
        }
    }
    for expected in ["Deployment", "Service", "ConfigMap", "EnvoyFilter"] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "no {expected} among {kinds:?}"
        );
    }
    assert!(rule_files > 0);
}

/// The README runs the server with `cargo run --release -- serve`: with the
/// load tools in src/bin beside it, that needs the package's default binary.
#[test]
fn cargo_run_starts_the_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    assert!(
        readme.contains("cargo run --release -- serve"),
        "the README's run command"
    );
    let other_binaries = std::fs::read_dir(root.join("src/bin")).map_or(0, |d| d.count());
    assert!(
        other_binaries == 0
            || manifest
                .lines()
                .any(|l| l.trim() == "default-run = \"tollgate\""),
        "Cargo.toml needs default-run = \"tollgate\" for `cargo run -- serve`"
    );
}
