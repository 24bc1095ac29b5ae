//! The Kubernetes manifests in examples/kubernetes: each overlay builds with
//! `kubectl kustomize`, its pods are hardened, and the rules in its ConfigMap
//! pass `tollgate check`. (No cluster runs here; scripts/check-manifests.sh
//! validates the built manifests against the Kubernetes schemas and a policy
//! scanner.)

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn parse(text: &str, what: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(text)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn kubernetes_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes")
}

/// What `kubectl kustomize` builds from overlay `name`.
fn overlay(name: &str) -> Vec<serde_json::Value> {
    let dir = kubernetes_dir().join("overlays").join(name);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubectl (with kustomize) is needed to build {}: install kubectl ({e})",
                dir.display()
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8_lossy(&out.stdout), name)
}

/// The rules of a ConfigMap pass `tollgate check`.
fn rules_pass_check(doc: &serde_json::Value, what: &str) -> usize {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = doc["data"].as_object().expect("ConfigMap data");
    for (name, text) in data {
        std::fs::write(tmp.path().join(name), text.as_str().expect("text")).expect("write");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(tmp.path())
        .output()
        .expect("tollgate check");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    data.len()
}

fn env_value<'a>(container: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// Every pod of `deployment` runs hardened (see the issue's list).
fn assert_hardened(deployment: &serde_json::Value, what: &str) {
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
    assert_eq!(pod["automountServiceAccountToken"], false, "{what}");
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"],
        "{what}: the selector matches the pod labels"
    );
    for c in pod["containers"].as_array().expect("containers") {
        let name = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}/{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}/{name}");
        assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{what}/{name}");
        for kind in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    c["resources"][kind][resource].is_string(),
                    "{what}/{name}: resources.{kind}.{resource}"
                );
            }
        }
        assert!(c["readinessProbe"].is_object(), "{what}/{name}: readiness");
        assert!(c["livenessProbe"].is_object(), "{what}/{name}: liveness");
        if name == "tollgate" {
            // Alive means the gRPC server answers, not that Redis does.
            let grpc = &c["livenessProbe"]["grpc"];
            assert_eq!(grpc["port"], 8081, "{what}: a gRPC liveness probe");
            assert_eq!(grpc["service"], tollgate::LIVENESS_SERVICE, "{what}");
        }
        let image = c["image"].as_str().expect("image");
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        assert!(
            !tag.is_empty() && tag != "latest" && !tag.contains('/'),
            "{what}/{name}: image {image} needs a release tag"
        );
    }
}

#[test]
fn overlays_build_hardened_manifests_whose_rules_pass_tollgate_check() {
    for (name, replicas, store) in [("memory", 1, "memory"), ("redis", 3, "redis")] {
        let docs = overlay(name);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for expected in [
            "Namespace",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "ServiceAccount",
        ] {
            assert!(
                kinds.contains(&expected),
                "{name}: no {expected} in {kinds:?}"
            );
        }
        let mut rule_files = 0;
        for doc in &docs {
            assert!(doc["metadata"]["name"].is_string(), "{name}: {doc}");
            match doc["kind"].as_str() {
                Some("ConfigMap") => rule_files += rules_pass_check(doc, name),
                Some("Deployment") => assert_hardened(doc, name),
                _ => {}
            }
        }
        assert!(rule_files > 0, "{name}: rules");
        let tollgate = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "tollgate")
            .expect("the tollgate Deployment");
        assert_eq!(tollgate["spec"]["replicas"], replicas, "{name}");
        let pod = &tollgate["spec"]["template"];
        let container = &pod["spec"]["containers"][0];
        // Derived from the replica count, never written by hand.
        assert_eq!(
            env_value(container, "TOLLGATE_INSTANCES"),
            Some(replicas.to_string().as_str()),
            "{name}"
        );
        assert_eq!(
            env_value(container, "TOLLGATE_STORE"),
            Some(store),
            "{name}"
        );
        assert!(
            container["lifecycle"]["preStop"].is_object(),
            "{name}: a preStop hook lets Envoy drain"
        );
        // Prometheus finds the metrics: a named port and the annotations.
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{name}");
        let port = annotations["prometheus.io/port"].as_str().expect("port");
        assert!(
            container["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["name"] == "metrics"
                    && p["containerPort"]
                        .as_u64()
                        .map(|n| n.to_string())
                        .as_deref()
                        == Some(port)),
            "{name}: a port named metrics on {port}"
        );
        assert_eq!(
            env_value(container, "TOLLGATE_ADMIN_ADDR"),
            Some(format!("0.0.0.0:{port}").as_str()),
            "{name}: the admin port listens on the pod's address"
        );
    }
}

/// The durable overlay: one hardened StatefulSet (no Deployment) whose pod
/// keeps its counters on a volume of its own, mounted where
/// TOLLGATE_DATA_DIR points.
#[test]
fn the_durable_overlay_keeps_the_counters_on_a_claimed_volume() {
    let docs = overlay("durable");
    let kind = |k: &str| docs.iter().filter(|d| d["kind"] == k).count();
    assert_eq!((kind("Deployment"), kind("StatefulSet")), (0, 1));
    assert!(kind("Service") == 1 && kind("PodDisruptionBudget") == 1);
    let rule_files: usize = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| rules_pass_check(d, "durable"))
        .sum();
    assert!(rule_files > 0, "rules");
    let set = docs
        .iter()
        .find(|d| d["kind"] == "StatefulSet")
        .expect("the StatefulSet");
    assert_hardened(set, "durable");
    assert_eq!(
        set["spec"]["replicas"], 1,
        "one replica: the counters are its own"
    );
    assert_eq!(set["spec"]["serviceName"], "tollgate");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_value(container, "TOLLGATE_STORE"), Some("memory"));
    assert_eq!(env_value(container, "TOLLGATE_INSTANCES"), Some("1"));
    let dir = env_value(container, "TOLLGATE_DATA_DIR").expect("TOLLGATE_DATA_DIR");
    let mounts = container["volumeMounts"].as_array().expect("mounts");
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"] == dir)
        .expect("a volume mounted at the data directory");
    assert_ne!(mount["readOnly"], true, "{mount}");
    let claim = &set["spec"]["volumeClaimTemplates"][0];
    assert_eq!(
        claim["metadata"]["name"], mount["name"],
        "the claim is what is mounted"
    );
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteOnce");
    assert!(claim["spec"]["resources"]["requests"]["storage"].is_string());
    assert!(
        container["lifecycle"]["preStop"].is_object(),
        "Envoy drains first"
    );
}

#[test]
fn the_istio_envoyfilter_parses() {
    let path = kubernetes_dir().join("istio-envoyfilter.yaml");
    let docs = parse(&std::fs::read_to_string(&path).expect("manifest"), "istio");
    let filter = docs
        .iter()
        .find(|d| d["kind"] == "EnvoyFilter")
        .expect("an EnvoyFilter");
    assert!(
        !filter["spec"]["configPatches"]
            .as_array()
            .expect("patches")
            .is_empty()
    );
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

/// The NetworkPolicy admits gRPC from selected pods (the gateways) and the
/// admin port from selected ones (monitoring), each port on its own rule:
/// never a port open to every pod in the cluster.
#[test]
fn the_network_policy_admits_each_port_from_selected_peers_only() {
    for name in ["memory", "redis"] {
        let docs = overlay(name);
        let policy = docs
            .iter()
            .find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "tollgate")
            .expect("the tollgate NetworkPolicy");
        let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
        let mut admitted = Vec::new();
        for rule in rules {
            let from = rule["from"].as_array().map_or(&[][..], |f| f.as_slice());
            assert!(
                !from.is_empty(),
                "{name}: an ingress rule from anywhere: {rule}"
            );
            for peer in from {
                let selects = |key: &str| {
                    peer[key]["matchLabels"]
                        .as_object()
                        .is_some_and(|m| !m.is_empty())
                };
                assert!(
                    selects("podSelector") || selects("namespaceSelector"),
                    "{name}: a peer that selects every pod: {peer}"
                );
            }
            let ports: Vec<u64> = rule["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .filter_map(|p| p["port"].as_u64())
                .collect();
            assert_eq!(ports.len(), 1, "{name}: one port per rule: {rule}");
            admitted.extend(ports);
        }
        admitted.sort_unstable();
        assert_eq!(admitted, [6070, 8081], "{name}");
    }
}

/// One version everywhere: Cargo.toml (so `--version`), the image's label,
/// the manifests' image tag and the CHANGELOG's newest release.
#[test]
fn the_version_is_the_same_everywhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        read("Containerfile").contains(&format!("ARG VERSION={version}\n")),
        "Containerfile's VERSION"
    );
    for kustomization in [
        "examples/kubernetes/base/kustomization.yaml",
        "examples/kubernetes/overlays/durable/kustomization.yaml",
    ] {
        assert!(
            read(kustomization).contains(&format!("newTag: \"{version}\"")),
            "the manifests' image tag in {kustomization}"
        );
    }
    let changelog = read("CHANGELOG.md");
    let newest = changelog
        .lines()
        .find(|l| l.starts_with("## [") && !l.starts_with("## [Unreleased]"))
        .expect("a released version in CHANGELOG.md");
    assert!(
        newest.starts_with(&format!("## [{version}] - ")),
        "the CHANGELOG's newest release is {newest:?}, not {version}"
    );
}

/// The rules overlay pattern: the overlay's own rule files replace the
/// base's in the ConfigMap the Deployment mounts, under the same name (no
/// hash suffix, so a rules change reloads in place instead of rolling pods).
#[test]
fn the_custom_rules_overlay_replaces_the_rules_in_place() {
    let docs = overlay("custom-rules");
    let configmap = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap");
    assert_eq!(configmap["metadata"]["name"], "tollgate-rules");
    let files: Vec<&String> = configmap["data"]
        .as_object()
        .expect("data")
        .keys()
        .collect();
    assert_eq!(files, ["shop.yaml"], "only the overlay's rules");
    assert_eq!(rules_pass_check(configmap, "custom-rules"), 1);
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    assert_hardened(deployment, "custom-rules");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    assert!(
        volumes
            .iter()
            .any(|v| v["configMap"]["name"] == "tollgate-rules"),
        "the Deployment mounts the overlay's rules: {volumes:?}"
    );
}

/// docs/kubernetes.md's image override, written as an overlay of the Redis
/// overlay, replaces Tollgate's image and nothing else.
#[test]
fn the_documented_image_override_points_the_deployment_at_your_image() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/kubernetes.md")).expect("page");
    let block = page
        .split("<!-- docs-test: kustomization -->\n```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the marked kustomization in docs/kubernetes.md");
    // The overlay beside the Redis one, as the page says, in a folder of
    // the test's own: its `../redis` made relative from there.
    let dir = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let redis = kubernetes_dir().join("overlays/redis");
    let up = dir
        .path()
        .components()
        .count()
        .checked_sub(1)
        .expect("a path");
    let relative = format!(
        "{}{}",
        "../".repeat(up),
        redis.display().to_string().trim_start_matches('/')
    );
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        block.replace("../redis", &relative),
    )
    .expect("write");
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = parse(&String::from_utf8_lossy(&out.stdout), "image override");
    let images: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert!(
        images.contains(&"registry.example.com/tollgate:0.2.0"),
        "{images:?}"
    );
    assert!(
        !images.iter().any(|i| i.starts_with("ghcr.io/tollgate/")),
        "{images:?}"
    );
}

#[test]
fn the_admin_token_overlay_mounts_a_secret_its_group_alone_reads() {
    let docs = overlay("admin-token");
    let tollgate = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "tollgate")
        .expect("the tollgate Deployment");
    assert_hardened(tollgate, "admin-token");
    let pod = &tollgate["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        env_value(container, "TOLLGATE_ADMIN_TOKEN_FILE"),
        Some("/etc/tollgate/admin/tokens")
    );
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "admin-token")
        .expect("the token volume");
    assert_eq!(volume["secret"]["secretName"], "tollgate-admin-token");
    // 0440: the pod's fsGroup reads it (Tollgate does not run as root),
    // nobody else; Tollgate's mode check accepts that and refuses more.
    assert_eq!(volume["secret"]["defaultMode"], 0o440);
    assert!(pod["securityContext"]["fsGroup"].is_number(), "{pod}");
    let mount = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "admin-token")
        .expect("the token mount");
    assert_eq!(mount["mountPath"], "/etc/tollgate/admin");
    assert_eq!(mount["readOnly"], true);
    // The Secret itself is the operator's to create: never shipped.
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "no token in the manifests"
    );
}
