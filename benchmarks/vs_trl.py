"""Single-turn RL throughput: opencomposer against TRL's GRPOTrainer on the same job, in one run.

    .venv/bin/python benchmarks/vs_trl.py [--json] [--steps 4] [--threads N]

The job, identical on both sides: the tiny Qwen3-MoE of configs/model/tiny.yaml without its MTP
module (random weights, seeded; ~13M parameters, 8 experts, top-2), the bundled 4k tokenizer,
4 prompts × 8 completions per step, at most 64 completion tokens (stop at <|eos|>), sampling at
temperature 1, a Python reward function (the fraction of digits in the completion), Dr. GRPO
(no std scaling; Σ/constant aggregation), no KL (β = 0: no reference model on either side), one
optimiser step per batch, AdamW at lr 1e-6, for `--steps` steps, all on the CPU.

TRL (`trl.GRPOTrainer`) gets the same weights through transformers' `Qwen3MoeForCausalLM` (our
`save_pretrained` writes its format) and our tokenizer as a `PreTrainedTokenizerFast`, and
generates with its own `model.generate`. Each side runs in a fresh Python process of its own, one
after the other (opencomposer first): neither inherits the other's warm-up, allocator settings or
thread pools. opencomposer runs its single-turn mode: the embedded
engine (continuous batching, KV cache, logprobs and routed experts per token), the trainer with
router replay, and the in-place delta weight sync.

Figure: completion tokens per second, generation and training together = completion tokens
generated over the steps / wall time of the steps. For TRL the wall time is `trainer.train()`;
for opencomposer the sum of its steps' times (generation + reward + train step + weight sync),
and, reported beside it, the whole `run_single_turn` call including model and engine set-up and
the final checkpoint. Completion tokens are counted from what each side generated (a completion
that samples <|eos|> is shorter), so the two figures are per token actually produced.

CPU limit of opencomposer's train steps (in the JSON: `train_limit_s`, `train_fraction_of_limit`):
the steps' matmul FLOPs, forward and backward (torch.utils.flop_counter on a fresh trainer of the
same config, replaying the run's own batches after the timed runs; attention counted over every
query-key pair its kernel is given), over the fp32 matmul rate measured at the run's thread count
(2048^3, as benchmarks/decode.py measures it); the fraction is limit / measured train seconds.
Elementwise work and the optimizer are not in the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opencomposer.rl.config import load_rl_config  # noqa: E402
from opencomposer.model import ModelConfig, Transformer, save_pretrained  # noqa: E402
from opencomposer.model.tokenizer import bundled_tokenizer  # noqa: E402
from opencomposer.rl.single_turn import digit_fraction, run_single_turn  # noqa: E402
from opencomposer.rl.trainer import Trainer, load_policy  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from train_step import count_flops, matmul_rate  # noqa: E402

G, PROMPTS_PER_STEP, MAX_NEW, LR, SEED = 8, 4, 64, 1e-6, 0


def prompts(n: int) -> list[str]:
    return [f"# the sum of {17 * i % 997} and {31 * i % 991}\nx = " for i in range(n)]


def model_config() -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "model" / "tiny.yaml").read_text())
    cfg["num_mtp_modules"] = 0  # TRL's model has no MTP head; keep the two models identical
    return cfg


def run_opencomposer(workdir: Path, steps: int) -> dict:
    (workdir / "model.yaml").write_text(yaml.safe_dump(model_config()))
    cfg = load_rl_config(data={
        "run": {"out_dir": str(workdir / "oc_run"), "seed": SEED},
        "model": {"config": str(workdir / "model.yaml")},
        "engine": {"max_slots": G * PROMPTS_PER_STEP, "max_len": 128},
        "sampling": {"temperature": 1.0, "max_new_tokens": MAX_NEW, "stop_at_eos": True},
        "data": {"prompts": prompts(PROMPTS_PER_STEP * steps), "rewards": ["opencomposer.rl.single_turn:digit_fraction"],
                 "group_size": G, "groups_per_step": PROMPTS_PER_STEP, "shuffle": False},
        "train": {"max_steps": steps, "micro_batch_size": G * PROMPTS_PER_STEP, "optim": {"lr": LR}},
        "loss": {"aggregation": "constant"},
        "advantage": {"estimator": "dr_grpo"},
        "reward": {"kl_coef": 0.0},
        "checkpoint": {"every_steps": 10_000, "keep_last": 1},
        "log": {"tensorboard": False, "progress": False},
    })
    per_step, batches = [], []
    step = Trainer.step

    def recording_step(self, groups):  # keeps each step's groups for the FLOP count below
        batches.append(groups)
        return step(self, groups)

    Trainer.step = recording_step
    try:
        t0 = time.perf_counter()
        run_single_turn(cfg, on_step=lambda step, m: per_step.append(m))
        total = time.perf_counter() - t0
    finally:
        Trainer.step = step
    tokens = sum(m["gen/completion_tokens"] for m in per_step)
    step_time = sum(m["step/time_s"] for m in per_step)
    return {"completion_tokens": int(tokens), "seconds": step_time, "tokens_per_s": tokens / step_time,
            "seconds_with_setup": total, "tokens_per_s_with_setup": tokens / total,
            "gen_seconds": sum(m["gen/time_s"] for m in per_step),
            "train_seconds": sum(m["time/step_s"] for m in per_step),
            "reward_mean": sum(m["reward/mean"] for m in per_step) / len(per_step),
            "_cfg": cfg, "_batches": batches}


def train_limit(oc: dict) -> dict:
    """The train steps' CPU limit: their matmul FLOPs, forward and backward (counted on a fresh
    trainer of the same config replaying the run's own batches), over the measured fp32 matmul
    rate at this run's thread count; and the measured train time's fraction of it."""
    cfg, batches = oc.pop("_cfg"), oc.pop("_batches")
    trainer = Trainer.from_config(cfg, load_policy(cfg.model, cfg.run.seed))
    flops = sum(count_flops(lambda: trainer.step(groups)) for groups in batches)
    rate = matmul_rate(torch.get_num_threads())
    limit = flops / rate
    return {"train_matmul_flops": flops, "matmul_GFLOPs": rate / 1e9, "train_limit_s": limit,
            "train_fraction_of_limit": limit / oc["train_seconds"]}


def run_trl(workdir: Path, steps: int) -> dict:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen3MoeForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    ours = Transformer(ModelConfig.from_dict(model_config()))
    save_pretrained(ours, workdir / "hf_model")
    tok = bundled_tokenizer()
    tok.save(workdir / "hf_model")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(workdir / "hf_model"))
    tokenizer.padding_side = "left"
    model = Qwen3MoeForCausalLM.from_pretrained(str(workdir / "hf_model"), dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_id
    model.generation_config.pad_token_id = tok.pad_id
    model.generation_config.bos_token_id = tok.bos_id
    # our single-turn mode prepends <|bos|>; so does this prompt text for TRL
    bos = tok.hf.id_to_token(tok.bos_id)
    data = Dataset.from_list([{"prompt": bos + p} for p in prompts(PROMPTS_PER_STEP * steps)])
    generated = []

    def digit_reward(prompts, completions, completion_ids=None, **kw):
        generated.append(sum(len(ids) for ids in completion_ids))
        return [digit_fraction(p, c) for p, c in zip(prompts, completions)]

    args = GRPOConfig(
        output_dir=str(workdir / "trl_run"), max_steps=steps, learning_rate=LR, per_device_train_batch_size=G * PROMPTS_PER_STEP,
        gradient_accumulation_steps=1, num_generations=G, max_completion_length=MAX_NEW, temperature=1.0,
        beta=0.0, loss_type="dr_grpo", scale_rewards=False, num_iterations=1, use_cpu=True, bf16=False,
        report_to="none", logging_steps=1, save_strategy="no", shuffle_dataset=False, seed=SEED,
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=data,
                          processing_class=tokenizer)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    tokens = sum(generated)
    return {"completion_tokens": int(tokens), "seconds": seconds, "tokens_per_s": tokens / seconds}


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to stdout (Python's sys.stdout and file descriptor 1) to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_side(side: str, steps: int, threads: int | None) -> dict:
    """One side of the job in a fresh Python process (same interpreter, same flags): neither side
    inherits the other's warm caches, allocator state (training/allocator.py is process-wide) or
    thread pools, and the order they run in does not matter."""
    cmd = [sys.executable, __file__, "--side", side, "--steps", str(steps)] + (["--threads", str(threads)] if threads else [])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"vs_trl.py: the {side} side failed (exit {done.returncode}); its output is above")
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_main(side: str, steps: int) -> None:
    """The child of run_side: one side's figures as one JSON line on stdout."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # TRL prints its per-step logs on stdout; keep stdout for the figures
    with tempfile.TemporaryDirectory() as tmp, stdout_to_stderr():
        if side == "opencomposer":
            result = run_opencomposer(Path(tmp), steps)
            result.update(train_limit(result))
        else:
            result = run_trl(Path(tmp), steps)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--side", choices=("opencomposer", "trl"), help=argparse.SUPPRESS)  # run_side's child
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side:
        return side_main(args.side, args.steps)
    oc = run_side("opencomposer", args.steps, args.threads)
    trl = run_side("trl", args.steps, args.threads)
    import trl as trl_pkg

    n_params = sum(p.numel() for p in Transformer(ModelConfig.from_dict(model_config())).parameters())
    result = {
        "job": {"params": n_params, "experts": model_config()["num_experts"], "prompts_per_step": PROMPTS_PER_STEP,
                "completions_per_prompt": G, "max_completion_tokens": MAX_NEW, "steps": args.steps,
                "torch_threads": torch.get_num_threads(), "trl_version": trl_pkg.__version__},
        "opencomposer": oc, "trl": trl,
        "ratio": oc["tokens_per_s"] / trl["tokens_per_s"],
        "ratio_with_setup": oc["tokens_per_s_with_setup"] / trl["tokens_per_s"],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"job: {n_params / 1e6:.1f}M params, {result['job']['experts']} experts, {PROMPTS_PER_STEP} prompts × {G} "
          f"completions × ≤{MAX_NEW} tokens, {args.steps} steps, {torch.get_num_threads()} threads, "
          f"TRL {trl_pkg.__version__}")
    print(f"opencomposer: {oc['completion_tokens']} completion tokens in {oc['seconds']:.2f} s = "
          f"{oc['tokens_per_s']:.0f} tokens/s (generation {oc['gen_seconds']:.2f} s, train {oc['train_seconds']:.2f} s; "
          f"with set-up {oc['tokens_per_s_with_setup']:.0f} tokens/s)")
    print(f"train steps: {oc['train_seconds']:.2f} s against a CPU limit of {oc['train_limit_s']:.2f} s "
          f"({oc['train_matmul_flops'] / 1e9:.1f} GFLOP forward and backward at {oc['matmul_GFLOPs']:.0f} GFLOP/s): "
          f"{oc['train_fraction_of_limit']:.0%}")
    print(f"TRL GRPOTrainer: {trl['completion_tokens']} completion tokens in {trl['seconds']:.2f} s = "
          f"{trl['tokens_per_s']:.0f} tokens/s")
    print(f"ratio: {result['ratio']:.1f}× (with opencomposer's set-up: {result['ratio_with_setup']:.1f}×)")


if __name__ == "__main__":
    main()
