"""Train-inference mismatch with and without router replay: engine in bfloat16, trainer in float32.

    .venv/bin/python benchmarks/router_replay.py [--json] [--model DIR]

The engine (a bfloat16 copy of the model) samples completions at temperature 1 and returns,
per output token, its logprob and the experts its forward routed to. The "trainer" is the
float32 model's training forward (`model(input_ids)`, no cache) over prompt + output, run twice:
without replay (its own router) and with replay of the engine's experts (prompt rows and
output rows, `routed_experts=`), as Ma et al. 2510.11370 ("R3") and Composer 2 §6.2 do; and a
third time with replay plus the plausibility rule (`replay_min_ratio`, prime-rl PR #2703).

Per output token, r = exp(logp_train - logp_engine) and k3 = (r - 1) - log r (Schulman's
estimator, always >= 0): since tokens are sampled from the engine, mean k3 estimates
KL(pi_engine || pi_train) of the per-token next-token distributions. (k3 is used here to
*measure* the mismatch; the report's objection to k3 is as a loss term, where its variance
grows when the two policies diverge.) Also reported: mean |logp_train - logp_engine|, and
the fraction of output tokens whose routing differs from the engine's in at least one MoE
layer (and of single (token, layer) decisions), where the trainer's routing is its own without
replay and the replayed set with replay (differences then come only from the plausibility rule).

Model: the decode benchmark's ~15M config with random weights whose scale is raised
(--init-std) so that next-token distributions are not flat and the router is not uniform; or a
trained checkpoint with --model DIR. Random weights make routing near-ties frequent, so the
absolute figures differ from a trained model's; the with/without comparison is the point.
"""

from __future__ import annotations

import argparse
import copy
import json
import math

import numpy as np
import torch

from opencomposer.engine import Engine, GenerationRequest, SamplingParams
from opencomposer.model import ModelConfig, Transformer, load_pretrained

from decode import BENCH_CONFIG


def train_logprobs(model: Transformer, ids: list[int], P: int, routed: np.ndarray | None,
                   min_ratio: float | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(logp of output tokens, routing [T_out, Y, K] that produced them, experts replaced)."""
    x = torch.tensor([ids])
    replay = None
    if routed is not None:
        replay = torch.from_numpy(routed)[None].to(torch.int64)
    with torch.inference_mode():
        out = model(x, routed_experts=replay, replay_min_ratio=min_ratio, return_routed_experts=True)
    logp = torch.log_softmax(out.logits[0, P - 1:-1].float(), -1)
    tok = torch.tensor(ids[P:])[:, None]
    return (logp.gather(-1, tok)[:, 0].numpy().astype(np.float64), out.routed_experts[0, P - 1:-1].numpy(),
            out.replaced_experts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", help="an HF-format checkpoint directory (default: random ~15M config)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--init-std", type=float, default=0.3, help="std of the random weights (no --model)")
    ap.add_argument("--min-ratio", type=float, default=0.5, help="plausibility threshold of the third column")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        model = load_pretrained(args.model, dtype=torch.float32)
    else:
        model = Transformer(ModelConfig(**{**BENCH_CONFIG, "initializer_range": args.init_std})).eval()
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, cfg.vocab_size, (args.prompts, args.prompt_len), generator=g).tolist()
    engine = Engine(copy.deepcopy(model), max_slots=args.prompts, max_len=args.prompt_len + args.new_tokens + 1,
                    dtype=torch.bfloat16)
    results = engine.generate_batch([
        GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=i),
                          return_routed_experts=True, return_prompt_routed_experts=True)
        for i, p in enumerate(prompts)])
    engine.stop()

    columns = {"no_replay": (False, None), "replay": (True, None),
               f"replay_min_ratio_{args.min_ratio}": (True, args.min_ratio)}
    out: dict = {"tokens": sum(len(r.output_ids) for r in results), "engine_dtype": "bfloat16",
                 "train_dtype": "float32", "kl_estimator": "k3 = (r-1) - log r, r = exp(logp_train - logp_engine), "
                 "mean over sampled output tokens (estimates KL(engine || train))"}
    entropy = []
    for name, (replay, ratio) in columns.items():
        k3, absdiff, tok_diff, dec_diff, replaced = [], [], [], [], 0
        for r in results:
            P = len(r.prompt_ids)
            ids = r.prompt_ids + r.output_ids
            rows = None
            if replay:  # every input position: prompt rows, then output rows 1.. (row 0 = prompt's last)
                rows = np.concatenate([r.prompt_routed_experts, r.routed_experts[1:],
                                       -np.ones_like(r.routed_experts[:1])])
            logp_train, routing, n_rep = train_logprobs(model, ids, P, rows, ratio)
            replaced += n_rep
            log_r = logp_train - np.asarray(r.logprobs, dtype=np.float64)
            k3 += (np.exp(log_r) - 1 - log_r).tolist()
            absdiff += np.abs(log_r).tolist()
            same = np.sort(routing, -1) == np.sort(r.routed_experts, -1)  # [T, Y, K]
            decision_differs = ~same.all(-1)                               # [T, Y]
            tok_diff += decision_differs.any(-1).tolist()
            dec_diff += decision_differs.ravel().tolist()
            if not replay and not entropy:
                with torch.inference_mode():
                    logits = model(torch.tensor([ids])).logits[0, P - 1:-1].float()
                entropy.append(float(-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()))
        out[name] = {"mean_k3": float(np.mean(k3)), "mean_abs_logp_diff": float(np.mean(absdiff)),
                     "tokens_with_routing_diff": float(np.mean(tok_diff)),
                     "routing_decisions_diff": float(np.mean(dec_diff)), "experts_replaced": int(replaced)}
    out["mean_next_token_entropy_nats"] = entropy[0] if entropy else None
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['tokens']} sampled tokens, engine bfloat16 vs training forward float32 "
          f"(next-token entropy ~{out['mean_next_token_entropy_nats']:.2f} nats; "
          f"{len(cfg.moe_layers)} MoE layers, {cfg.num_experts} experts, top-{cfg.num_experts_per_tok})")
    names = list(columns)
    print(f"{'':34}" + "".join(f"{n:>24}" for n in names))
    for key, label in (("mean_k3", "mean k3 KL per token"), ("mean_abs_logp_diff", "mean |logp diff|"),
                       ("tokens_with_routing_diff", "tokens with a routing diff"),
                       ("routing_decisions_diff", "(token, layer) decisions diff"),
                       ("experts_replaced", "experts replaced by min_ratio")):
        vals = [out[n][key] for n in names]
        fmt = (lambda v: f"{v:>24d}") if key == "experts_replaced" else (lambda v: f"{v:>24.3g}")
        print(f"{label:34}" + "".join(fmt(v) for v in vals))
    if not math.isfinite(out["no_replay"]["mean_k3"]):
        print("warning: non-finite KL")


if __name__ == "__main__":
    main()
