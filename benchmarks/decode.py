"""Decode throughput of the engine: against transformers' `generate`, plain against MTP
speculative decoding, and against this machine's limit.

    .venv/bin/python benchmarks/decode.py [--json] [--model DIR] [--threads N]

Model: a ~15M-parameter Qwen3-MoE (hidden 256, 4 layers, 8 experts of width 448, top-2,
vocab 4096, one MTP module) with random weights, or a checkpoint (--model DIR). transformers
runs the same weights: saved with opencomposer.model.save_pretrained and read back by
`Qwen3MoeForCausalLM.from_pretrained`. Both decode the same prompts greedily (batch 1 and 16,
--new-tokens each, float32); tokens/s = generated tokens / wall time of the whole call
(prefill included), median of --repeats runs.

Machine limit: the benchmark measures the read bandwidth (sum of a 512 MiB tensor) and the
fp32 matmul rate (2048^3 matmul) with the same thread count. One decode step of B rows reads
the weights it uses once (attention and router of every layer, the experts any row was routed
to at that step, the output head, B embedding rows) plus the KV cache of every row, and does
2 * B * (active parameters) + 4 * B * H * C * context flops. Its limit is the larger of
bytes / bandwidth and flops / matmul rate; the achieved fraction is limit / measured median
step time at batch 16 (engine.stats.recent_steps).

Speculative decoding: with random weights the MTP module's drafts are rarely accepted, so
it can only cost time here; a trained model (--model) shows the speed-up. Reported: tokens/s
at batch 1 and 16, ratio to plain, acceptance rate, and mean tokens per verify step (accepted
drafts + 1). Also the event loop's lag (a 1 ms sleep's overshoot) while the engine decodes a
batch of 16 through `await engine.generate`, to show that the server stays responsive.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import tempfile
import time

import torch

from opencomposer.engine import Engine, GenerationRequest, SamplingParams
from opencomposer.model import ModelConfig, Transformer, load_pretrained, save_pretrained

BENCH_CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, moe_intermediate_size=448,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_mtp_modules=1,
                    max_position_embeddings=4096)


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


# ---- the machine ------------------------------------------------------------------------

def machine_rates(repeats: int = 5) -> tuple[float, float]:
    """(read bandwidth bytes/s, fp32 matmul flop/s), medians."""
    x = torch.ones(128 * 2**20)  # 512 MiB
    x.sum()
    t_sum, _ = median_time(lambda: x.sum(), repeats)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t_mm, _ = median_time(lambda: a @ b, repeats)
    return x.numel() * 4 / t_sum, 2 * 2048**3 / t_mm


def step_cost(model: Transformer, B: int, context: float, experts_used: list[int]) -> tuple[float, float]:
    """(bytes read, flops) of one decode step of B rows at mean context length `context`;
    experts_used[j]: distinct experts MoE layer j ran at that step."""
    cfg, size = model.config, next(model.parameters()).element_size()
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    read = flops = 0.0
    j = 0
    for layer in model.layers:
        attn = n(layer.self_attn) + n(layer.input_layernorm) + n(layer.post_attention_layernorm)
        read += attn
        flops += 2 * B * attn + 4 * B * cfg.num_attention_heads * cfg.head_dim * context
        read += 2 * B * context * cfg.num_key_value_heads * cfg.head_dim  # keys and values
        if hasattr(layer.mlp, "experts"):
            one = 3 * cfg.hidden_size * cfg.moe_intermediate_size
            read += n(layer.mlp.gate) + experts_used[j] * one
            flops += 2 * B * (n(layer.mlp.gate) + cfg.num_experts_per_tok * one)
            j += 1
        else:
            read += n(layer.mlp)
            flops += 2 * B * n(layer.mlp)
    head = n(model.lm_head) + n(model.norm)
    read += head + B * cfg.hidden_size
    flops += 2 * B * head
    return read * size, flops


# ---- the two implementations ------------------------------------------------------------

def bench_transformers(path: str, prompts: list[list[int]], new_tokens: int, repeats: int) -> tuple[float, list]:
    import transformers
    from transformers import Qwen3MoeForCausalLM

    transformers.logging.set_verbosity_error()  # the MTP tensors are "unexpected" to it, by design

    hf = Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)

    def run():
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()

    run()  # warm-up
    t, out = median_time(run, repeats)
    return len(prompts) * new_tokens / t, out


def bench_engine(engine: Engine, prompts: list[list[int]], new_tokens: int, repeats: int) -> tuple[float, list, dict]:
    reqs = [GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=new_tokens)) for p in prompts]
    engine.generate_batch(reqs[:1])  # warm-up
    st = engine.stats
    st.recent_steps.clear()
    before = (st.spec_accepted, st.spec_proposed)
    t, results = median_time(lambda: engine.generate_batch(reqs), repeats)
    full = [dt for rows, dt in st.recent_steps if rows == len(prompts)]
    accepted, proposed = st.spec_accepted - before[0], st.spec_proposed - before[1]
    extra = {"step_ms_median": 1e3 * statistics.median(full) if full else None,
             "acceptance": accepted / proposed if proposed else None,
             "tokens_per_step": 1 + engine.k * accepted / proposed if proposed else 1.0}
    return len(prompts) * new_tokens / t, [r.output_ids for r in results], extra


async def event_loop_lag(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """Median and max overshoot (ms) of a 1 ms asyncio sleep while a batch decodes."""
    lags, done = [], asyncio.Event()

    async def probe():
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    task = asyncio.create_task(probe())
    await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=new_tokens)))
                           for p in prompts))
    done.set()
    await task
    return 1e3 * statistics.median(lags), 1e3 * max(lags)


def routed_experts_per_layer(model: Transformer, prompts: list[list[int]]) -> list[int]:
    """Distinct experts each MoE layer runs for one decode step over these rows (the last
    prompt token of each row), as the benchmark's batch routes them."""
    with torch.inference_mode():
        routed = model(torch.tensor(prompts), return_routed_experts=True).routed_experts[:, -1]  # [B, Y, K]
    return [len(set(routed[:, j].flatten().tolist())) for j in range(routed.shape[1])]


# ---- main -------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--model", help="an HF-format checkpoint directory (default: random ~15M config)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_pretrained(args.model, dtype=torch.float32) if args.model else Transformer(ModelConfig(**BENCH_CONFIG)).eval()
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    mtp_params = sum(p.numel() for p in model.mtp.parameters())
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
    max_len = args.prompt_len + args.new_tokens + 8
    out = {"params": params, "params_without_mtp": params - mtp_params, "threads": args.threads,
           "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "batch": args.batch}

    bw, mm_rate = machine_rates()
    out.update(bandwidth_GBps=bw / 1e9, matmul_GFLOPs=mm_rate / 1e9)

    engine = Engine(copy.deepcopy(model), max_slots=args.batch, max_len=max_len)
    for B in (1, args.batch):
        tps, outputs, extra = bench_engine(engine, prompts[:B], args.new_tokens, args.repeats)
        out[f"engine_tps_b{B}"] = tps
        out[f"engine_step_ms_b{B}"] = extra["step_ms_median"]
        out[f"engine_outputs_b{B}"] = outputs
    lag_med, lag_max = asyncio.run(event_loop_lag(engine, prompts, args.new_tokens))
    out.update(event_loop_lag_ms_median=lag_med, event_loop_lag_ms_max=lag_max, prepacked=engine.prepacked)
    engine.stop()
    eager = Engine(copy.deepcopy(model), max_slots=args.batch, max_len=max_len, prepack_weights=False)
    tps, outputs, extra = bench_engine(eager, prompts, args.new_tokens, args.repeats)
    out.update(engine_eager_kernels_tps=tps, engine_eager_kernels_step_ms=extra["step_ms_median"])
    eager.stop()

    if not args.skip_transformers:
        with tempfile.TemporaryDirectory() as d:
            save_pretrained(model, d)
            for B in (1, args.batch):
                tps, hf_out = bench_transformers(d, prompts[:B], args.new_tokens, args.repeats)
                out[f"transformers_tps_b{B}"] = tps
                same = sum(a == b for a, b in zip(hf_out, out[f"engine_outputs_b{B}"]))
                out[f"same_outputs_b{B}"] = f"{same}/{B}"
                out[f"speedup_b{B}"] = out[f"engine_tps_b{B}"] / tps

    context = args.prompt_len + args.new_tokens / 2
    used = routed_experts_per_layer(model, prompts)
    nbytes, flops = step_cost(model, args.batch, context, used)
    limit_s = max(nbytes / bw, flops / mm_rate)
    out.update(step_bytes=nbytes, step_flops=flops, experts_used_per_layer=used,
               limit_step_ms=1e3 * limit_s, limit_bound="bandwidth" if nbytes / bw >= flops / mm_rate else "compute",
               fraction_of_limit=1e3 * limit_s / out[f"engine_step_ms_b{args.batch}"])

    if cfg.num_mtp_modules:
        spec = Engine(copy.deepcopy(model), max_slots=args.batch, max_len=max_len, speculative_depth=cfg.num_mtp_modules)
        for B in (1, args.batch):
            tps, outputs, extra = bench_engine(spec, prompts[:B], args.new_tokens, args.repeats)
            out[f"spec_tps_b{B}"] = tps
            out[f"spec_ratio_b{B}"] = tps / out[f"engine_tps_b{B}"]
            out[f"spec_acceptance_b{B}"] = extra["acceptance"]
            out[f"spec_tokens_per_step_b{B}"] = extra["tokens_per_step"]
            out[f"spec_same_as_plain_b{B}"] = outputs == out[f"engine_outputs_b{B}"]
        out["spec_depth"] = cfg.num_mtp_modules
        spec.stop()

    for B in (1, args.batch):
        out.pop(f"engine_outputs_b{B}")
    if args.json:
        print(json.dumps(out, indent=2))
        return
    B = args.batch
    print(f"model: {params / 1e6:.1f}M parameters ({(params - mtp_params) / 1e6:.1f}M without MTP), "
          f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}; {args.threads} threads; "
          f"prompts {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, float32")
    print(f"machine: read bandwidth {bw / 1e9:.1f} GB/s, fp32 matmul {mm_rate / 1e9:.0f} GFLOP/s")
    for b in (1, B):
        line = f"batch {b:>2}: engine {out[f'engine_tps_b{b}']:8.0f} tok/s"
        if f"transformers_tps_b{b}" in out:
            line += (f"   transformers {out[f'transformers_tps_b{b}']:7.0f} tok/s   x{out[f'speedup_b{b}']:.1f}"
                     f"   same outputs {out[f'same_outputs_b{b}']}")
        print(line)
    print(f"batch {B} with eager kernels (prepack_weights=False): {out['engine_eager_kernels_tps']:.0f} tok/s, "
          f"step {out['engine_eager_kernels_step_ms']:.2f} ms")
    print(f"batch {B} decode step: {out[f'engine_step_ms_b{B}']:.2f} ms measured, limit {out['limit_step_ms']:.2f} ms "
          f"({out['limit_bound']}-bound: {nbytes / 1e6:.1f} MB, {flops / 1e6:.0f} MFLOP; experts used per layer "
          f"{used}) -> {100 * out['fraction_of_limit']:.0f}% of the limit")
    print(f"event loop lag while decoding: median {lag_med:.2f} ms, max {lag_max:.1f} ms")
    if cfg.num_mtp_modules:
        for b in (1, B):
            print(f"batch {b:>2}: MTP speculative (depth {out['spec_depth']}) {out[f'spec_tps_b{b}']:8.0f} tok/s, "
                  f"x{out[f'spec_ratio_b{b}']:.2f} of plain, acceptance {out[f'spec_acceptance_b{b}']:.2f}, "
                  f"{out[f'spec_tokens_per_step_b{b}']:.2f} tokens/step, same output as plain: "
                  f"{out[f'spec_same_as_plain_b{b}']}")


if __name__ == "__main__":
    main()
