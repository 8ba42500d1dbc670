"""The train step at the demo's shapes: trainer seconds per RL step, SFT seconds per step.

    .venv/bin/python benchmarks/train_step.py [--json] [--repeats 3] [--only rl|sft]
        [--rl-threads 1] [--sft-threads 2] [--flops] [--dtype float32|bfloat16]

Without the full `make demo`: the demo's model (pipeline.DEFAULT_MODEL, vocabulary 2,048, MTP
module included, random weights, seeded) and batches shaped like the demo's, built from
seeded random tokens:

  * RL (`Trainer.step` at the RL stage's settings: 16 groups x G = 8, micro-batches of 16,
    router replay, lr 2e-4, one thread as `run.num_threads` gives the RL stage): every sample
    starts with its group's shared prefix (system turn and instruction, 337 tokens as the demo
    environment renders them with the bundled tokenizer, plus the first tool call and its
    result in half of the groups: 100 more), then 150-350 tokens of its own in three assistant
    turns (80-200 generated tokens in all) with tool output between them. Half of the groups
    are tied (one reward for all: advantage 0, skipped by the trainer, as about half the demo's
    groups are); the rest have mixed rewards. Routed experts are random but equal across a
    group's prefix, as the engine returns them for identical tokens.
  * SFT (pretrain/sft.py's `_train_step` at the SFT stage's settings: batch 8, MTP off, two
    threads, deterministic algorithms as the run sets them): 8 examples of 510-545 tokens that
    share a 300-token system turn, 83-91 trained tokens each (the oracle's demonstrations on
    the demo family at difficulty 0: measured 512-544 tokens, 83-91 trained, 337 before the
    first trained token).

Each figure is the median over `--repeats` steps after one warm-up step (the optimizer's state
is allocated in the first), with the process's CPU seconds per step beside it (`cpu_s`: less
sensitive to other jobs on the cores at one thread). `--flops` adds the step's matmul FLOPs (forward and backward,
counted by torch.utils.flop_counter on one step) over the measured matmul rate at the step's
thread count: the CPU limit of the step, and the step's fraction of it.

Before/after: the script uses only `Trainer.step` and `sft._train_step`, so running it from
two checkouts (`git worktree add /tmp/before <commit>`, then the same command with
PYTHONPATH=/tmp/before) compares them on the same batches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (the "before" tree) comes first

from opencomposer.model import ModelConfig, Transformer  # noqa: E402
from opencomposer.rl.buffer import Group, Sample  # noqa: E402

DEMO_MODEL = {"hidden_size": 128, "intermediate_size": 384, "moe_intermediate_size": 192, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
              "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 1024,
              "num_mtp_modules": 1, "vocab_size": 2048}
"""pipeline.DEFAULT_MODEL with the demo tokenizer's vocabulary (restated: the "before" tree may differ)."""
SYSTEM, FIRST_CALL = 337, 100   # tokens: system turn + instruction; the first tool call and its result
GROUPS, G, MICRO_BATCH, RL_LR = 16, 8, 16, 2e-4
SFT_BATCH, SFT_LR, SFT_SYSTEM = 8, 3e-3, 300


def demo_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**DEMO_MODEL))


def rl_groups(seed: int = 0) -> list[Group]:
    """16 groups x 8 samples shaped like the demo's RL batches (module docstring)."""
    rng = np.random.default_rng(seed)
    V, Y, K = DEMO_MODEL["vocab_size"], DEMO_MODEL["num_hidden_layers"], DEMO_MODEL["num_experts_per_tok"]
    groups = []
    for g in range(GROUPS):
        P = SYSTEM + (FIRST_CALL if g % 2 else 0)
        prefix = rng.integers(0, V, P)
        prefix_routed = np.stack([rng.choice(DEMO_MODEL["num_experts"], K, replace=False) for _ in range(P * Y)])
        prefix_routed = prefix_routed.reshape(P, Y, K).astype(np.int32)
        tied = g % 4 < 2   # half of the groups, one reward for all
        samples = []
        for i in range(G):
            own = int(rng.integers(150, 351))
            n_gen = int(rng.integers(80, 201))
            ids = np.concatenate([prefix, rng.integers(0, V, own)])
            mask = np.zeros(P + own, bool)
            cuts = np.sort(rng.choice(np.arange(1, own), 2, replace=False))   # three assistant turns
            turn = [n_gen // 3, n_gen // 3, n_gen - 2 * (n_gen // 3)]
            starts = [0, cuts[0], cuts[1]]
            for s, n in zip(starts, turn):
                mask[P + s:P + min(s + n, own)] = True
            routed = np.concatenate([prefix_routed, np.stack([rng.choice(DEMO_MODEL["num_experts"], K, replace=False)
                                                              for _ in range(own * Y)]).reshape(own, Y, K)])
            behav = np.where(mask, -rng.uniform(7.0, 8.5, P + own), 0.0)
            reward = 0.0 if tied else float(rng.integers(0, 2))
            samples.append(Sample(ids, mask, behav, reward, f"g{g}", f"t{g}", routed_experts=routed.astype(np.int32),
                                  policy_versions=np.where(mask, 0, -1)))
        if not tied and len({s.reward for s in samples}) == 1:
            samples[0].reward = 1.0 - samples[0].reward
        groups.append(Group(f"g{g}", f"t{g}", samples))
    return groups


def sft_batches(n: int, seed: int = 0) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """n batches of 8 examples shaped like the demo's SFT examples (module docstring)."""
    rng = np.random.default_rng(seed)
    V = DEMO_MODEL["vocab_size"]
    system = rng.integers(0, V, SFT_SYSTEM)
    out = []
    for _ in range(n):
        batch = []
        for _ in range(SFT_BATCH):
            L = int(rng.integers(510, 546))
            ids = np.concatenate([system, rng.integers(0, V, L - SFT_SYSTEM)]).astype(np.int32)
            mask = np.zeros(L, np.uint8)
            n_train = int(rng.integers(83, 92))
            first = 337 + int(rng.integers(0, 10))
            mask[first:first + 25] = 1                    # the read_file call
            mask[L - (n_train - 25):] = 1                 # the edit and "Done."
            batch.append((ids, mask))
        out.append(batch)
    return out


def _median(times: list[float]) -> float:
    return statistics.median(times)


def rl_trainer(dtype: str = "float32"):
    """The RL stage's trainer: its train section, β = 0 (no reference model), default loss."""
    from opencomposer.rl.config import TrainConfig
    from opencomposer.rl.rewards import RewardConfig
    from opencomposer.rl.trainer import Trainer

    return Trainer(demo_model(), TrainConfig(micro_batch_size=MICRO_BATCH, optim={"lr": RL_LR}, dtype=dtype),
                   reward=RewardConfig(kl_coef=0.0))


def run_rl(repeats: int, threads: int, dtype: str = "float32") -> dict:
    torch.set_num_threads(threads)
    trainer = rl_trainer(dtype)
    groups = rl_groups()
    times, cpu, m = [], [], {}
    for r in range(repeats + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        m = trainer.step(groups)
        if r:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"threads": threads, "step_s": _median(times), "steps_s": times,
            "cpu_s": _median(cpu),
            "tokens_total": m["tokens/total"], "tokens_generated": m["tokens/generated"],
            "skipped_samples": m["samples/skipped_zero_advantage"]}


def sft_setup(dtype: str = "float32"):
    from opencomposer.pretrain import sft
    from opencomposer.pretrain.train import make_optimizer, use_deterministic_algorithms

    cfg = sft.load_config(None, data={"run": {"out_dir": "unused"}, "init_from": "unused", "steps": 1200,
                                      "batch_size": SFT_BATCH, "optim": {"lr": SFT_LR, "warmup_steps": 10},
                                      "mtp": None, "dtype": dtype})
    use_deterministic_algorithms()
    model = demo_model().train()
    r = SimpleNamespace(model=model, optimizer=make_optimizer(model, cfg), pad=0, device=torch.device("cpu"))
    return sft, cfg, r


def run_sft(repeats: int, threads: int, dtype: str = "float32") -> dict:
    torch.set_num_threads(threads)
    sft, cfg, r = sft_setup(dtype)
    batches = sft_batches(repeats + 1)
    times, cpu = [], []
    for i, batch in enumerate(batches):
        t0, c0 = time.perf_counter(), time.process_time()
        sft._train_step(r, cfg, batch, SFT_LR)
        if i:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"threads": threads, "step_s": _median(times), "steps_s": times, "cpu_s": _median(cpu),
            "tokens": int(sum(len(x) for x, _ in batches[0])), "targets": int(sum(m.sum() for _, m in batches[0]))}


def matmul_rate(threads: int, repeats: int = 5) -> float:
    """fp32 matmul FLOP/s at `threads` threads (2048^3, as benchmarks/decode.py measures it)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / _median(times)


def count_flops(fn) -> int:
    """Matmul FLOPs of fn(), forward and backward: torch.utils.flop_counter's (mm, bmm, addmm,
    attention), plus the CPU attention kernel it does not register, counted as its GPU
    counterpart (every query-key pair the kernel is given, masked or not)."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    aten = torch.ops.aten

    def raw(f):
        def g(*args, **kwargs):
            return f(*args, **kwargs)
        g._get_raw = True  # already shape-wrapped in the registry
        return g

    cpu = {aten._scaled_dot_product_flash_attention_for_cpu: raw(flop_registry[aten._scaled_dot_product_flash_attention]),
           aten._scaled_dot_product_flash_attention_for_cpu_backward:
               raw(flop_registry[aten._scaled_dot_product_flash_attention_backward])}
    with FlopCounterMode(display=False, custom_mapping=cpu) as counter:
        fn()
    return int(counter.get_total_flops())


def step_flops() -> dict[str, int]:
    """Matmul FLOPs (forward + backward) of one RL trainer step and one SFT step."""
    trainer = rl_trainer()
    groups = rl_groups()
    rl = count_flops(lambda: trainer.step(groups))
    sft, cfg, r = sft_setup()
    batch = sft_batches(1)[0]
    return {"rl": rl, "sft": count_flops(lambda: sft._train_step(r, cfg, batch, SFT_LR))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["rl", "sft"], default=None)
    parser.add_argument("--rl-threads", type=int, default=1, help="the RL stage's run.num_threads")
    parser.add_argument("--sft-threads", type=int, default=2, help="the SFT stage's run.train_threads")
    parser.add_argument("--flops", action="store_true", help="add the CPU limit (matmul FLOPs / matmul rate)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the steps' compute dtype (train.dtype / sft.dtype); --flops counts at float32's rate")
    args = parser.parse_args()
    out: dict = {"code": str(Path(sys.modules["opencomposer"].__file__).parents[1]), "dtype": args.dtype}
    if args.only in (None, "rl"):
        out["rl"] = run_rl(args.repeats, args.rl_threads, args.dtype)
    if args.only in (None, "sft"):
        out["sft"] = run_sft(args.repeats, args.sft_threads, args.dtype)
    if args.flops:
        flops = step_flops()
        for name, threads in (("rl", args.rl_threads), ("sft", args.sft_threads)):
            if name in out:
                rate = matmul_rate(threads)
                limit = flops[name] / rate
                out[name].update(matmul_flops=flops[name], matmul_GFLOPs=rate / 1e9, limit_s=limit,
                                 fraction_of_limit=limit / out[name]["step_s"])
    if args.json:
        print(json.dumps(out))
        return
    print(f"code: {out['code']} ({args.dtype})")
    for name in ("rl", "sft"):
        if name in out:
            o = out[name]
            line = f"{name}: {o['step_s']:.3f} s per step ({o['threads']} threads; steps {', '.join(f'{t:.3f}' for t in o['steps_s'])})"
            if "limit_s" in o:
                line += (f"; limit {o['limit_s']:.3f} s ({o['matmul_flops'] / 1e9:.1f} GFLOP at "
                         f"{o['matmul_GFLOPs']:.0f} GFLOP/s): {o['fraction_of_limit']:.0%}")
            print(line)


if __name__ == "__main__":
    main()
