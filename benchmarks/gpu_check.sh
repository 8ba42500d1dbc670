#!/usr/bin/env bash
# Issue 20's GPU check, prepared as one script (~8 minutes on one H100 or H200).
#
#   bash benchmarks/gpu_check.sh --prepare-wheels            here, before the device call
#   bash benchmarks/gpu_check.sh --prepare-model DIR [PROMPTS]
#   bash benchmarks/gpu_check.sh                             on the GPU machine
#
# Here (no GPU needed), both fill .gpu/ (ignored by git; name it in the device call's `carry`).
# --prepare-wheels: the wheels of the packages this project needs that the GPU machines' image
# lacks (pydantic and its three dependencies, at this venv's versions, for the image's Python 3.12).
# --prepare-model: a trained model with MTP modules for the speculative-decoding part, cast to
# bfloat16 (a 32-layer model of the demo's width is ~90 MB in float32, over the device tool's
# 64 MiB) with its tokenizer, and PROMPTS beside it: agent trajectories (default:
# DIR/../sft_data/trajectories.jsonl, the SFT run's demonstrations) or a JSON list of token-id
# lists (decode.py --prompts). The deep model of docs/benchmarks.md ("A 32-layer model trained the
# same way": the demo's pipeline at 32 layers, then opencomposer.pretrain.mtp_distill) is the one
# the issue names. Then, from the repository root, one device call:
#
#   run: bash benchmarks/gpu_check.sh        carry: [".gpu"]        timeout_s: 600
#
# On the GPU machine each step writes its JSON to $OUT (the device tool's folder; runs/gpu_check
# when unset) and its stderr beside it; a failing step is reported without stopping the others:
#   1. decode_b16.json, decode_b64.json: benchmarks/decode.py --device cuda, the engine against
#      transformers on the random ~15M model (batch 1 and 16, then batch 1 and 64), greedy outputs
#      compared, the device's bandwidth and matmul rate and the step's fraction of its limit;
#   2. deep_b16.json, deep_b64.json (with a model in .gpu/deep): MTP speculative decoding at depth
#      min(3, the model's modules) with its own drafts and with every draft accepted
#      (--oracle-drafts), on 128 tokens and on agent turns, at batch 1, 16 and 64: acceptance and
#      the ratio to plain decoding;
#   3. pretrain.json: benchmarks/pretrain.py on configs/pretrain/gpu_small.yaml (bfloat16, an MoE
#      of 0.97B total / 0.18B active, phase 0's 131k-token step): tokens/s and MFU (989 TFLOP/s).
# A summary is printed last. GPU_CHECK_DEVICE=cpu, GPU_CHECK_DECODE_ARGS (appended to every
# decode.py call), GPU_CHECK_PRETRAIN_CONFIG and GPU_CHECK_DIR (instead of .gpu) run the same
# steps small on a CPU (tests/test_gpu_check.py); nothing here has run on a GPU yet (no GPU was
# lent to issue 20).
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_CHECK_DIR:-.gpu}

prepare_model() {  # DIR PROMPTS
  local model=$1 prompts=$2
  [[ -f "$prompts" ]] || { echo "no prompts at $prompts: give them as the second argument" >&2; return 2; }
  rm -rf "$GPU_DIR/deep" && mkdir -p "$GPU_DIR/deep" || return 1
  "$PY" -c '
import sys

import torch

from opencomposer.model import load_pretrained, save_pretrained
from opencomposer.model.tokenizer import Tokenizer

src, dst = sys.argv[1:]
model = load_pretrained(src, dtype=torch.bfloat16)
if model.config.num_mtp_modules < 1:
    raise SystemExit(f"{src}: no MTP modules (distil some first: python -m opencomposer.pretrain.mtp_distill)")
save_pretrained(model, dst, tokenizer=Tokenizer.load(src))
' "$model" "$GPU_DIR/deep" || return 1
  case "$prompts" in
    *.json) cp "$prompts" "$GPU_DIR/deep/prompts.json" ;;
    *) cp "$prompts" "$GPU_DIR/deep/prompts.jsonl" ;;
  esac
}

case "${1:-}" in
  --prepare-wheels)
    PY=${PYTHON:-.venv/bin/python}
    mkdir -p "$GPU_DIR/wheels"
    pins=$("$PY" -c 'import importlib.metadata as m; print(" ".join(f"{n}=={m.version(n)}" for n in
           ("pydantic", "pydantic_core", "annotated_types", "typing_inspection")))') || exit 1
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$GPU_DIR/wheels" $pins || exit 1
    du -sh "$GPU_DIR"
    exit 0 ;;
  --prepare-model)
    PY=${PYTHON:-.venv/bin/python}
    model=${2:?usage: $0 --prepare-model DIR [PROMPTS]}
    prepare_model "$model" "${3:-$model/../sft_data/trajectories.jsonl}" || exit $?
    du -sh "$GPU_DIR"
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--prepare-wheels | --prepare-model DIR [PROMPTS]]" >&2; exit 2 ;;
esac

OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
read -r -a EXTRA <<< "${GPU_CHECK_DECODE_ARGS:-}"
PRETRAIN_CONFIG=${GPU_CHECK_PRETRAIN_CONFIG:-configs/pretrain/gpu_small.yaml}
export PYTHONUNBUFFERED=1
if compgen -G "$GPU_DIR/wheels/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site \
    "$GPU_DIR"/wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/gpu-check-site:$PWD
else
  export PYTHONPATH=$PWD
fi
if [[ "$DEVICE" == cuda ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "- CUDA device:", torch.cuda.is_available())'

failed=()
step() {  # step NAME COMMAND...: its stdout to $OUT/NAME.json, its stderr to $OUT/NAME.log
  local name=$1 t0=$SECONDS
  shift
  if "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"; then
    echo "$name: done in $((SECONDS - t0)) s"
  else
    echo "$name: FAILED after $((SECONDS - t0)) s; the end of its log:"
    tail -n 15 "$OUT/$name.log"
    failed+=("$name")
  fi
}

decode=("$PY" benchmarks/decode.py --device "$DEVICE" --json --repeats 3)
step decode_b16 "${decode[@]}" --batch 16 "${EXTRA[@]}"
step decode_b64 "${decode[@]}" --batch 64 "${EXTRA[@]}"
deep=$GPU_DIR/deep
if [[ -f "$deep/config.json" ]]; then
  prompts=$(ls "$deep"/prompts.json "$deep"/prompts.jsonl 2> /dev/null | head -n 1)
  depth=$("$PY" -c 'import json, sys; print(min(3, json.load(open(sys.argv[1]))["num_mtp_modules"]))' \
    "$deep/config.json")
  for b in 16 64; do
    step "deep_b$b" "${decode[@]}" --batch $b --b1-prompts 16 --model "$deep" --prompts "$prompts" \
      --spec-depth "$depth" --oracle-drafts --skip-transformers "${EXTRA[@]}"
  done
else
  echo "deep model: none in $deep (bash benchmarks/gpu_check.sh --prepare-model DIR); skipped"
fi
step pretrain "$PY" benchmarks/pretrain.py --config "$PRETRAIN_CONFIG" --steps 5 --warmup 2 --json

"$PY" - "$OUT" <<'EOF'
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])


def load(name):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


for name in ("decode_b16", "decode_b64"):
    d = load(name)
    if d:
        B = d["batch"]
        line = (f"{name}: {d['device']}: engine {d['engine_tps_b1']:.0f} tok/s at batch 1, "
                f"{d[f'engine_tps_b{B}']:.0f} at {B}")
        if "speedup_b1" in d:
            line += (f"; x{d['speedup_b1']:.2f} and x{d[f'speedup_b{B}']:.2f} transformers "
                     f"(same outputs {d['same_outputs_b1']}, {d[f'same_outputs_b{B}']})")
        print(line + f"; {100 * d['fraction_of_limit']:.0f}% of the limit at batch {B}")
for name in ("deep_b16", "deep_b64"):
    d = load(name)
    if d:
        B = d["batch"]
        for tag in ("spec", "turns_spec", "oracle", "turns_oracle"):
            if f"{tag}_acceptance" in d:
                print(f"{name} {tag} (depth {d['spec_depth']}): acceptance {d[f'{tag}_acceptance']:.2f}; "
                      f"x{d[f'{tag}_ratio_b1']:.2f} plain at batch 1, x{d[f'{tag}_ratio_b{B}']:.2f} at {B}; "
                      f"same output as plain {d[f'{tag}_same_as_plain_b1']}, {d[f'{tag}_same_as_plain_b{B}']}")
d = load("pretrain")
if d:
    mfu = f"MFU {100 * d['mfu']:.1f}%" if d["mfu"] is not None else "no MFU off a GPU"
    print(f"pretrain: {d['config']} on {d['device_name']}: {d['tokens_per_s']:.0f} tokens/s, {mfu}")
EOF
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
