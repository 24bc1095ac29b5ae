#!/usr/bin/env bash
# Builds each Kubernetes overlay in examples/kubernetes/overlays and checks
# what it builds: against the Kubernetes schemas (kubernetes-validate
# --strict: unknown fields are errors) and with a policy scanner (checkov;
# the checks it skips, each with its reason, are in
# examples/kubernetes/checkov.yaml). Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/deps.sh
source scripts/deps.sh
ensure_check_tools

out=.build/k8s
rm -rf "$out"
mkdir -p "$out"
built=()
for overlay in examples/kubernetes/overlays/*/; do
    name=$(basename "$overlay")
    kubectl kustomize "$overlay" > "$out/$name.yaml"
    built+=("$out/$name.yaml")
done
.build/venv/bin/kubernetes-validate --strict --quiet "${built[@]}"
files=()
for f in "${built[@]}"; do files+=(-f "$f"); done
.build/venv/bin/checkov --config-file examples/kubernetes/checkov.yaml "${files[@]}"
echo "manifests: ${#built[@]} overlays valid, no failed policy check"
