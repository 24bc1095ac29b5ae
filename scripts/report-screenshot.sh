#!/usr/bin/env bash
# A screenshot of a `tollgate simulate --out DIR` report in a real headless
# browser (Chromium from the Debian packages, installed if missing):
#   scripts/report-screenshot.sh DIR [OUT.png]
# writes DIR/report.png (or OUT.png) and fails if Chromium drew nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
dir=${1:?usage: scripts/report-screenshot.sh DIR [OUT.png]}
out=${2:-$dir/report.png}
[ -f "$dir/report.html" ] || { echo "no $dir/report.html: run tollgate simulate --out $dir first" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    apt_install chromium
    browser=$(command -v chromium)
fi
rm -f "$out"
# --no-sandbox: root in a container has no user namespace for the sandbox.
timeout 60 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1600,1300 --screenshot="$(realpath -m "$out")" "file://$(realpath "$dir/report.html")" 2>/dev/null
[ -s "$out" ] || { echo "Chromium wrote no screenshot" >&2; exit 1; }
echo "$out"
