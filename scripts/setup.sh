#!/usr/bin/env bash
# Installs what opencomposer needs on a fresh Debian machine (run as root), idempotently.
# Debian packages: bubblewrap (default sandbox), ripgrep (grep tool), runsc (gVisor backend),
# g++ (the engine's C++ CPU kernels; without it the engine runs its slower PyTorch path).
# A venv at .venv with torch pinned to the CPU wheel these machines carry, and the package
# in editable mode with its dev extras. Quiet when everything is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PKGS=(bubblewrap ripgrep runsc git patch chromium g++)
TORCH_PIN="torch==2.13.0"
STAMP=.venv/.opencomposer-setup
want_stamp=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to install ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  exit 0
fi

echo "setup: creating .venv and installing opencomposer (first run takes a few minutes)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip setuptools wheel
# Pin torch before anything else can ask for it: an unpinned requirement pulls a CUDA build.
.venv/bin/pip install -q "$TORCH_PIN"
.venv/bin/pip install -q -e ".[dev,embed]" "$TORCH_PIN"
# The engine's C++ kernels, compiled once per machine (~20 s) into ~/.cache/opencomposer; a
# failure only means the engine falls back to PyTorch, so it does not stop the setup.
.venv/bin/python -m opencomposer.engine.native || true
echo "$want_stamp" > "$STAMP"
echo "setup: done"
