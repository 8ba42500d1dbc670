"""Pretraining throughput: tokens/s of full training steps (forward, backward, AdamW) for a config.

    .venv/bin/python benchmarks/pretrain.py [--config configs/pretrain/tiny.yaml] [--phase 0]
                                            [--steps 5] [--warmup 1] [--threads N] [--json]

Runs the real loss module of pretrain/train.py (main CE + MTP loss in the config's mode, MTP
on) on random token ids of the phase's batch and sequence length, single process, on the GPU
when there is one. Prints tokens/s (median over steps) and, on a GPU, the model FLOPs
utilisation MFU = 6 * N_active * tokens/s / peak, with N_active counting the K routed experts a
token uses (attention's T^2 term left out, as in the PaLM convention) and peak given by
--peak-tflops (default 989, an H100/H200's dense bf16).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from opencomposer.model import ModelConfig, Transformer
from opencomposer.pretrain.config import load_config
from opencomposer.pretrain.train import PretrainLoss, make_optimizer


def active_params(model: Transformer) -> int:
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total - experts + experts * cfg.num_experts_per_tok // max(cfg.num_experts, 1) - model.embed_tokens.weight.numel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/pretrain/tiny.yaml")
    ap.add_argument("--phase", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--micro-batch-size", type=int, default=None, help="override the phase's (GPU memory)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    phase = cfg.phases[args.phase]
    micro, accum = phase.accumulation(1)
    micro = args.micro_batch_size or micro
    accum = phase.batch_size // micro
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_dict(cfg.model_dict())).to(device)
    loss_module = PretrainLoss(model, cfg.mtp)
    opt = make_optimizer(loss_module, cfg)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16")
    ids = torch.randint(16, model.config.vocab_size, (micro, phase.seq_len + 1), device=device)
    times = []
    for i in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(accum):
            with autocast:
                loss, _ = loss_module(ids, len(model.mtp) > 0)
            (loss / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    tokens = phase.batch_size * phase.seq_len
    tps = tokens / statistics.median(times)
    n_active = active_params(model)
    out = {"config": args.config, "phase": phase.name, "device": str(device),
           "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "threads": torch.get_num_threads(), "params": sum(p.numel() for p in model.parameters()),
           "active_params_no_embedding": n_active, "tokens_per_step": tokens, "step_s": statistics.median(times),
           "tokens_per_s": tps, "mfu": 6 * n_active * tps / (args.peak_tflops * 1e12) if device.type == "cuda" else None}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
