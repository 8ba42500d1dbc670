"""Synchronous vs asynchronous agentic RL on the same workload, in one run.

    .venv/bin/python benchmarks/async_rl.py [--steps 8] [--groups-per-step 4] [--json]

The workload: smoke-family tasks (the committed suite's 16, or a family generated once into the
cache when more are needed), G rollouts each, in real bwrap sandboxes through the real agent
loop, grader and orchestrator. The policy is scripted (no model decoding, so the figure is about
scheduling, not the engine): each rollout makes `turns` tool turns of `run_terminal_cmd sleep t`
with t heavy-tailed (Pareto, shape `--alpha`, scale `--tool-scale`, capped at `--tool-cap`), the
long tail of tool time agentic rollouts have (a test suite that hangs, a slow build), then
answers. Draws are seeded per (task, rollout), so both modes see identical tool times. The
trainer is real: rl/trainer.py's Trainer on a small Qwen3-MoE with one MTP module, one step per
batch of `groups_per_step` groups, and weights synced after each step with weight_sync's
InPlaceSync (delta on) into a FakeEngine whose policy version stamps the tokens.

    synchronous   max_staleness 0: generate a batch, wait for all of it, train, sync, repeat
    asynchronous  max_staleness s (default 2), staleness policy "wait": rollouts keep running
                  while the trainer steps, up to (s + 1) batches ahead

Both modes have the same rollout capacity (`--workers` groups at once); synchronous RL cannot
use more than one batch of it. Printed: wall time per step of each, their ratio (AReaL reports
2.77x [Fu et al. 2505.24298]; our target is >= 2.5x), the staleness distribution of trained
groups, and bytes per weight sync with the delta against the full state (with full-parameter
RL the delta saves the tensors that get no gradient: here the MTP module, which RL does not
train).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import zlib
from collections import Counter

import numpy as np
import torch

from opencomposer.rl.config import TrainConfig
from opencomposer.engine.fake import FakeEngine, assistant_reply
from opencomposer.engine.types import GenerationResult
from opencomposer.harness.agent import AgentConfig
from opencomposer.model import ModelConfig, Transformer
from opencomposer.model.chat import stop_token_ids
from opencomposer.model.tokenizer import bundled_tokenizer
from opencomposer.rl.config import AgenticConfig
from opencomposer.rl.orchestrator import Orchestrator
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.rollout import RolloutConfig
from opencomposer.rl.trainer import Trainer
from opencomposer.rl.weight_sync import InPlaceSync
from opencomposer.tasks.task import Suite

SMOKE = "tasks/suites/smoke"
MODEL = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=4096,
             num_mtp_modules=1)


class SleepyToolPolicy:
    """Token-level policy: `turns` turns of one `sleep t` terminal call each, then a final answer.
    Tokens carry the engine's current policy version (as a real engine's would)."""

    name = "sleepy-tools"

    def __init__(self, tok, engine: FakeEngine, sleeps: list[float]):
        self.tokenizer, self.engine, self.sleeps, self.calls = tok, engine, sleeps, 0

    async def generate(self, input_ids, sampling) -> GenerationResult:
        k, self.calls = self.calls, self.calls + 1
        if k < len(self.sleeps):
            ids = assistant_reply(self.tokenizer, tool_calls=[{"name": "run_terminal_cmd", "arguments": {
                "command": f"sleep {self.sleeps[k]:.3f}"}}])
        else:
            ids = assistant_reply(self.tokenizer, "Done.")
        assert ids[-1] == stop_token_ids(self.tokenizer)[0]
        return GenerationResult(request_id=f"s{k}", prompt_ids=list(input_ids), output_ids=ids,
                                finish_reason="stop", logprobs=[-1.0] * len(ids),
                                policy_versions=[self.engine.policy_version] * len(ids))


def tool_times(task_id: str, rollout: int, turns: int, alpha: float, scale: float, cap: float) -> list[float]:
    rng = np.random.default_rng(zlib.crc32(f"{task_id}/{rollout}".encode()))
    return [float(min(scale * (1 + rng.pareto(alpha)), cap)) for _ in range(turns)]


def run_mode(name: str, max_staleness: int, args, tasks, tok) -> dict:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**MODEL))
    trainer = Trainer(model, TrainConfig(micro_batch_size=16), reward=RewardConfig(kl_coef=0.0))
    engine = FakeEngine()
    sync = InPlaceSync(engine, delta=True)
    sync.sync(model, 0)
    rollout_no: Counter[str] = Counter()

    def make_policy(task):
        i = rollout_no[task.id]
        rollout_no[task.id] += 1
        return SleepyToolPolicy(tok, engine, tool_times(task.id, i, args.turns, args.alpha, args.tool_scale,
                                                        args.tool_cap))

    cfg = AgenticConfig(
        suite=SMOKE, shuffle=False, groups_per_step=args.groups_per_step, rollout_workers=args.workers,
        max_staleness=max_staleness, staleness_policy="wait",
        rollout=RolloutConfig(group_size=args.group_size, task_timeout_s=120, agent=AgentConfig(
            max_turns=args.turns + 2, max_new_tokens=512, summarize_at=None,
            tools=["read_file", "edit_file", "run_terminal_cmd"])))
    orch = Orchestrator(tasks, trainer, lambda v: sync.sync(model, v).as_metrics(), cfg, RewardConfig(),
                        make_policy=make_policy, max_steps=args.steps)
    t0 = time.perf_counter()
    history = asyncio.run(orch.run())
    wall = time.perf_counter() - t0
    hist: Counter[int] = Counter()
    for m in history:
        for k, v in m.items():
            if k.startswith("staleness/hist_"):
                hist[int(k.rsplit("_", 1)[1])] += int(v)
    return {"mode": name, "max_staleness": max_staleness, "steps": len(history), "wall_s": round(wall, 3),
            "s_per_step": round(wall / len(history), 3),
            "train_s_per_step": round(float(np.mean([m["time/train_s"] for m in history])), 3),
            "trainer_wait_s_per_step": round(float(np.mean([m["time/wait_s"] for m in history])), 3),
            "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "inflight_multi_version_frac": round(float(np.mean([m["inflight/multi_version_frac"] for m in history])), 3),
            "sync_bytes_sent_mean": float(np.mean([m["sync/bytes_sent"] for m in history])),
            "sync_bytes_full": float(history[-1]["sync/bytes_full"])}


def load_tasks(n: int) -> list:
    """n smoke-family tasks: the committed suite's, or a generated family (made once, cached)."""
    suite = Suite.load(SMOKE)
    if n <= len(suite.tasks):
        return suite.tasks[:n]
    from opencomposer.tasks.build import cache_dir
    from opencomposer.tasks.smoke import generate_tasks

    out = cache_dir() / "bench" / f"smoke-{n}"
    if not (out / "suite.toml").is_file():
        generate_tasks(n, 0, out)
    return Suite.load(out).tasks[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--workers", type=int, default=12, help="groups rolled out at once (both modes)")
    ap.add_argument("--staleness", type=int, default=2, help="max_staleness of the asynchronous mode")
    ap.add_argument("--turns", type=int, default=2, help="tool turns per rollout")
    ap.add_argument("--alpha", type=float, default=1.1, help="Pareto shape of tool times (smaller: heavier tail)")
    ap.add_argument("--tool-scale", type=float, default=0.3, help="minimum tool time, seconds")
    ap.add_argument("--tool-cap", type=float, default=10.0, help="tool time cap, seconds (a tool timeout)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tasks = load_tasks(args.steps * args.groups_per_step)  # both modes train on exactly these, once each
    tok = bundled_tokenizer()
    sync_r = run_mode("synchronous", 0, args, tasks, tok)
    async_r = run_mode("asynchronous", args.staleness, args, tasks, tok)
    out = {"workload": {k: v for k, v in vars(args).items() if k != "json"}, "synchronous": sync_r,
           "asynchronous": async_r, "speedup": round(sync_r["s_per_step"] / async_r["s_per_step"], 2),
           "delta_fraction": round(async_r["sync_bytes_sent_mean"] / async_r["sync_bytes_full"], 3)}
    if args.json:
        print(json.dumps(out))
        return
    for r in (sync_r, async_r):
        print(f"{r['mode']:>12} (s={r['max_staleness']}): {r['s_per_step']:.2f} s/step over {r['steps']} steps "
              f"(train {r['train_s_per_step']:.2f} s, trainer waiting {r['trainer_wait_s_per_step']:.2f} s); "
              f"staleness {r['staleness_hist']}; in-flight multi-version {r['inflight_multi_version_frac']:.2f}")
    print(f"speedup (sync s/step / async s/step): {out['speedup']:.2f}x  (AReaL: 2.77x; target >= 2.5x)")
    print(f"weight sync: {async_r['sync_bytes_sent_mean'] / 1e6:.2f} MB sent per sync (delta) vs "
          f"{async_r['sync_bytes_full'] / 1e6:.2f} MB full ({out['delta_fraction']:.1%})")


if __name__ == "__main__":
    main()
