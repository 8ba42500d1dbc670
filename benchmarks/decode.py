"""Decode throughput of the engine: against transformers' `generate`, plain against MTP
speculative decoding, and against this machine's limit.

    .venv/bin/python benchmarks/decode.py [--json] [--model DIR] [--threads N] [--spec-depth K]
        [--oracle-drafts] [--random-config JSON] [--b1-prompts N] [--skip-transformers] [--skip-torch-path]
        [--background-load N] [--sandbox-load] [--pool-policies 0,1,2] [--device cpu|cuda]

Model: a ~15M-parameter Qwen3-MoE (hidden 256, 4 layers, 8 experts of width 448, top-2,
vocab 4096, one MTP module) with random weights, or a checkpoint (--model DIR). transformers
runs the same weights: saved with opencomposer.model.save_pretrained and read back by
`Qwen3MoeForCausalLM.from_pretrained`. Both decode the same prompts greedily (batch 1 and 16,
--new-tokens each, float32); tokens/s = generated tokens / wall time of the whole call
(prefill included), median of --repeats rounds in which every variant runs once, round-robin
(the machine is shared: a busy spell then slows all variants alike, not just one).

Machine limit: the benchmark measures the read bandwidth (sum of a 512 MiB tensor) and the
fp32 matmul rate (2048^3 matmul) with the same thread count, once per round (medians). One decode step of B rows reads
the weights it uses once (attention and router of every layer, the experts any row was routed
to at that step, the output head, B embedding rows) plus the KV cache of every row, and does
2 * B * (active parameters) + 4 * B * H * C * context flops. Its limit is the larger of
bytes / bandwidth and flops / matmul rate; the achieved fraction is limit / measured median
step time at batch 16 (engine.stats.recent_steps).

Speculative decoding: with random weights the MTP module's drafts are rarely accepted, so
it can only cost time here; a trained model (--model) shows the speed-up. Reported: tokens/s
at batch 1 and 16, ratio to plain, acceptance rate, and mean tokens per verify step (accepted
drafts + 1). --oracle-drafts adds speculation's ceiling for the model at hand (random weights
too): the same engine with every draft replaced by the plain greedy output, so all are
accepted (OracleDraftEngine). --random-config changes the random model's shape (e.g. its
depth) to see how that ceiling moves. Also the event loop's lag (a 1 ms sleep's overshoot) while the engine decodes a
batch of 16 through `await engine.generate`, to show that the server stays responsive.

A busy machine (neighbours.py). --background-load N adds a condition with N busy processes
pinned to N CPUs, --sandbox-load one with the grader running the smoke suite's hidden tests in
a loop in the real sandbox (what RL and eval run beside the engine). The neighbours start
before the first round and are paused (not stopped) for the quiet passes: every round times
each runner quiet, then under each load, so every figure and its quiet counterpart come from
the same run and the same stretch of time. Under each condition the benchmark times the engine
at its default settings (--threads), the same engine on one thread (`engine_1t`: what the
default must never fall below), transformers, and with --pool-policies the engine at other
policies of the kernels' thread pool (csrc/pool.h: 0 one chunk per thread, as before the
adaptive pool; 1 pieces, always parallel; 2 pieces, parallel or serial from each region's
timings, the default before the free-CPU count; the default is 3, pieces on the CPUs that
other processes leave free). The JSON's top-level figures are the quiet ones;
`conditions` holds each condition's (the speed-ups, `engine_vs_1t_b*`, the pool's parallel and
serial regions and back-offs, the machine rates measured under that load). The torch path,
speculation and the event loop lag are measured quiet only.

On a GPU (--device cuda; issue 20's GPU check, benchmarks/gpu_check.sh): the same model, engine
and transformers on the device, in float32; the engine runs its PyTorch path there (the C++
kernels are the CPU's), so the one-thread engine, the torch-path runner, the pool policies and
the neighbours are left out. The machine limit is the device's: its read bandwidth and fp32
matmul rate, each timed between CUDA synchronizations.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from opencomposer.engine import Engine, GenerationRequest, SamplingParams, native
from opencomposer.model import ModelConfig, Transformer, load_pretrained, save_pretrained

BENCH_CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, moe_intermediate_size=448,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_mtp_modules=1,
                    max_position_embeddings=4096)


def median_time(fn, repeats: int, device: torch.device = torch.device("cpu")) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the machine ------------------------------------------------------------------------

def machine_rates(repeats: int = 5, device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(read bandwidth bytes/s, fp32 matmul flop/s) of `device`, medians."""
    x = torch.ones(128 * 2**20, device=device)  # 512 MiB
    x.sum()
    t_sum, _ = median_time(lambda: x.sum(), repeats, device)
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    a @ b
    t_mm, _ = median_time(lambda: a @ b, repeats, device)
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


# ---- the runners: each call is one timed generation of B greedy completions ---------------

class OneByOne(list):
    """Prompts to decode at batch 1, one request after another (each a call of its own)."""


class TransformersRunner:
    def __init__(self, path: str, new_tokens: int, device: torch.device = torch.device("cpu")):
        import transformers
        from transformers import Qwen3MoeForCausalLM

        transformers.logging.set_verbosity_error()  # the MTP tensors are "unexpected" to it, by design
        self.hf = Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        self.new_tokens, self.device = new_tokens, device

    def __call__(self, prompts: list[list[int]]) -> list[list[int]]:
        if isinstance(prompts, OneByOne):
            return [self([p])[0] for p in prompts]
        ids = torch.tensor(prompts, device=self.device)
        with torch.inference_mode():
            out = self.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.new_tokens,
                                   min_new_tokens=self.new_tokens, do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()


class OracleDraftEngine(Engine):
    """Speculation's ceiling on this model and machine: before every speculative step each row's
    drafts are replaced by the next k tokens of its plain greedy output (`reference`: prompt ->
    output), so every draft is accepted, as from a perfect MTP module. The step is otherwise the
    engine's own: it verifies k+1 tokens and still drafts with the MTP modules (whose drafts
    are then discarded), so its cost is a real step's at full acceptance (each depth recomputes
    its k+1 newest entries, the most it ever does)."""

    def __init__(self, model: Transformer, reference: dict[tuple[int, ...], list[int]], **kw):
        super().__init__(model, **kw)
        self.reference = reference

    def _spec_step(self, seqs) -> None:
        for s in seqs:
            out = self.reference[tuple(s.tokens[:s.prompt_len])]
            done = len(s.tokens) - s.prompt_len  # the last of these is pending; drafts follow it
            nxt = out[done:done + self.k]
            s.drafts = nxt + [0] * (self.k - len(nxt))
        super()._spec_step(seqs)


class EngineRunner:
    """One engine at one sampling setting; also records, per batch size, the decode steps'
    durations, the decode phase's tokens and seconds per call (tokens after each request's
    first, which prefill samples), and the drafts accepted and proposed."""

    def __init__(self, engine: Engine, new_tokens: int, stop: tuple[int, ...] = ()):
        self.engine, self.new_tokens, self.stop = engine, new_tokens, list(stop)
        self.step_s: dict[int, list[float]] = {}
        self.decode: dict[int, list[tuple[int, float]]] = {}
        self.accepted = self.proposed = 0
        self.pool = [0] * 6  # the kernels' pool over this runner's calls (pool_stats)

    def __call__(self, prompts: list[list[int]]) -> list[list[int]]:
        if isinstance(prompts, OneByOne):  # batch 1: the calls' tokens and seconds add up as one
            outs, n0 = [], len(self.decode.get(1, []))
            for p in prompts:
                outs += self([p])
            calls = self.decode[1][n0:]
            self.decode[1][n0:] = [(sum(n for n, _ in calls), sum(s for _, s in calls))]
            return outs
        st, B = self.engine.stats, len(prompts)
        st.recent_steps.clear()
        before = (st.generated_tokens, st.decode_s, st.spec_accepted, st.spec_proposed)
        pool_before = pool_stats()
        results = self.generate(prompts)
        self.pool = [a + b - c for a, b, c in zip(self.pool, pool_stats(), pool_before)]
        self.step_s.setdefault(B, []).extend(dt for rows, dt in st.recent_steps if rows == B)
        self.decode.setdefault(B, []).append((st.generated_tokens - before[0] - B, st.decode_s - before[1]))
        self.accepted += st.spec_accepted - before[2]
        self.proposed += st.spec_proposed - before[3]
        return [r.output_ids for r in results]

    def generate(self, prompts: list[list[int]]):
        """The engine's results at this runner's setting, recorded nowhere."""
        sp = SamplingParams(temperature=0, max_new_tokens=self.new_tokens, stop_token_ids=self.stop)
        return self.engine.generate_batch([GenerationRequest(p, sp) for p in prompts])

    def decode_tps(self, B: int) -> float:
        """Median over calls of decode-phase tokens / decode-phase seconds."""
        return statistics.median(n / s for n, s in self.decode[B] if s > 0)


def pool_stats() -> list[int]:
    """[parallel regions, serial regions, back-offs, ns of back-off, times a CPU was found taken
    by others, regions run on fewer threads for it] of the kernels' pool so far."""
    from opencomposer.engine import native

    ops = native.ops()
    return list(ops.pool_stats())[1:7] if ops is not None else [0] * 6


class PoolPolicyRunner:
    """A runner whose calls run at one policy of the kernels' thread pool (csrc/pool.h), restored after."""

    def __init__(self, inner, policy: int):
        self.inner, self.policy = inner, policy

    def __call__(self, prompts):
        from opencomposer.engine import native

        old = native.ops().pool_policy(self.policy)
        try:
            return self.inner(prompts)
        finally:
            native.ops().pool_policy(old)


# Before each timed call: torch's OpenMP workers spin for a while after the last parallel region
# of the caller before them (machine_rates, transformers), on the cores the next runner uses;
# without a pause that spin fell on whichever runner came next.
SETTLE_S = 0.05


def interleaved(conditions: dict[str, dict], neighbours: dict, batches: dict[int, list[list[int]]], repeats: int,
                device: torch.device = torch.device("cpu")):
    """Time every runner of every condition at every batch size, round-robin, `repeats` rounds
    (so that a busy spell on a shared machine hits all of them alike), each condition's
    neighbour running only during that condition's pass; returns per condition median
    tokens/s, outputs and the machine rates (bandwidth, matmul) measured once per round."""
    times: dict = {}
    outputs: dict = {}
    rates: dict = {c: [] for c in conditions}
    for run in next(iter(conditions.values())).values():
        run(batches[1])  # warm-up (the runners of every condition share the engines)
    for _ in range(repeats):
        for cond, runners in conditions.items():
            neighbour = neighbours.get(cond)
            if neighbour:
                neighbour.resume()
            try:
                rates[cond].append(machine_rates(3, device))
                for B, prompts in batches.items():
                    for name, run in runners.items():
                        time.sleep(SETTLE_S)
                        t0 = time.perf_counter()
                        outputs[cond, name, B] = run(prompts)
                        times.setdefault((cond, name, B), []).append(time.perf_counter() - t0)
            finally:
                if neighbour:
                    neighbour.pause()
    # generated tokens (every request's, stop tokens included) / median wall time of the call
    tps: dict = {c: {} for c in conditions}
    outs: dict = {c: {} for c in conditions}
    for (cond, name, B), ts in times.items():
        tps[cond][name, B] = sum(map(len, outputs[cond, name, B])) / statistics.median(ts)
        outs[cond][name, B] = outputs[cond, name, B]
    medians = {c: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for c, rs in rates.items()}
    return tps, outs, medians


def condition_figures(runners: dict, tps: dict, outputs: dict, batches: dict, rates: tuple[float, float],
                      nbytes: float, flops: float, big: int) -> dict:
    """One condition's figures: each side's tokens/s, the engine against transformers and
    against its own one-thread figure, the pool's regions, and the fraction of the limit."""
    out: dict = {}
    bw, mm = rates
    for B in batches:
        out[f"engine_tps_b{B}"] = tps["engine", B]
        out[f"engine_step_ms_b{B}"] = 1e3 * statistics.median(runners["engine"].step_s[B])
        if ("engine_1t", B) in tps:
            out[f"engine_1t_tps_b{B}"] = tps["engine_1t", B]
            out[f"engine_vs_1t_b{B}"] = tps["engine", B] / tps["engine_1t", B]
        for name in runners:
            if name.startswith("engine_policy"):
                out[f"{name}_tps_b{B}"] = tps[name, B]
                out[f"{name}_vs_1t_b{B}"] = tps[name, B] / tps["engine_1t", B]
        if "transformers" in runners:
            out[f"transformers_tps_b{B}"] = tps["transformers", B]
            out[f"speedup_b{B}"] = tps["engine", B] / tps["transformers", B]
            same = sum(a == b for a, b in zip(outputs["transformers", B], outputs["engine", B]))
            out[f"same_outputs_b{B}"] = f"{same}/{len(outputs['engine', B])}"
    parallel, serial, backoffs, backoff_ns, capped, capped_regions = runners["engine"].pool
    out.update(pool_parallel_regions=parallel, pool_serial_regions=serial, pool_backoffs=backoffs,
               pool_backoff_s=backoff_ns / 1e9, pool_capped_windows=capped, pool_capped_regions=capped_regions)
    limit_s = max(nbytes / bw, flops / mm)
    out.update(bandwidth_GBps=bw / 1e9, matmul_GFLOPs=mm / 1e9, limit_step_ms=1e3 * limit_s,
               limit_bound="bandwidth" if nbytes / bw >= flops / mm else "compute",
               fraction_of_limit=1e3 * limit_s / out[f"engine_step_ms_b{big}"])
    return out


async def event_loop_lag(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """Median and max overshoot (ms) of a 1 ms asyncio sleep while a batch decodes."""
    lags, done = [], asyncio.Event()

    async def probe():
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    task = asyncio.create_task(probe())
    sp = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    await asyncio.gather(*(engine.generate(GenerationRequest(p, sp)) for p in prompts))
    done.set()
    await task
    return 1e3 * statistics.median(lags), 1e3 * max(lags)


def routed_experts_per_layer(model: Transformer, prompts: list[list[int]]) -> list[int]:
    """Distinct experts each MoE layer runs for one decode step over these rows (the last
    prompt token of each row), as the benchmark's batch routes them."""
    ids = torch.tensor(prompts, device=next(model.parameters()).device)
    with torch.inference_mode():
        routed = model(ids, return_routed_experts=True).routed_experts[:, -1]  # [B, Y, K]
    return [len(set(routed[:, j].flatten().tolist())) for j in range(routed.shape[1])]


# ---- prompts ----------------------------------------------------------------------------

def trajectory_prompts(path: str, tokenizer_dir: str, n: int, prompt_len: int) -> list[list[int]]:
    """n prompts of prompt_len tokens from agent trajectories (harness JSONL, e.g. an SFT run's
    sft_data/trajectories.jsonl or an eval run's trajectories.jsonl), or from a JSON list of
    token-id lists. Each trajectory is rendered as SFT and RL see it (pretrain.sft.render: chat
    template, tools); every point where the policy starts generating (right after an
    <|assistant|> role token: a tool call or the final reply) gives one prompt, the prompt_len
    tokens before it (shorter prefixes are skipped), in file order."""
    import pathlib

    from opencomposer.harness.trajectory import read_jsonl
    from opencomposer.model.tokenizer import Tokenizer
    from opencomposer.pretrain.sft import render

    if pathlib.Path(path).suffix == ".json":
        seqs = [list(map(int, p)) for p in json.loads(pathlib.Path(path).read_text())]
        prompts = [p[-prompt_len:] for p in seqs if len(p) >= prompt_len]
    else:
        tok, prompts = Tokenizer.load(tokenizer_dir), []
        for traj in read_jsonl(path):
            for ids, mask in render(traj, tok):
                starts = [j for j in range(1, len(ids)) if mask[j] and not mask[j - 1] and j >= prompt_len]
                prompts += [ids[j - prompt_len:j] for j in starts]
            if len(prompts) >= n:
                break
    if len(prompts) < n:
        raise SystemExit(f"{path}: only {len(prompts)} prompts of {prompt_len} tokens; lower --prompt-len or --batch")
    return prompts[:n]


# ---- main -------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--model", help="an HF-format checkpoint directory (default: random ~15M config)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", help="with --model: trajectories JSONL (or a JSON list of token-id lists) to take "
                                      "prompts from (trajectory_prompts); default: random token ids")
    ap.add_argument("--tokenizer", help="for --prompts trajectories: tokenizer directory (default: --model's)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default: 32 (random ids), 256 (--prompts)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--b1-prompts", type=int, default=1,
                    help="batch 1 decodes this many of the prompts, one request after another (at most --batch)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec-depth", type=int, default=None, help="MTP draft depth k (default: the model's num_mtp_modules)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-torch-path", action="store_true", help="leave out the engine without its C++ kernels")
    ap.add_argument("--oracle-drafts", action="store_true",
                    help="also time speculation with every draft accepted (OracleDraftEngine): its ceiling here")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="add a condition with N busy processes pinned to N CPUs (neighbours.BusyCores)")
    ap.add_argument("--sandbox-load", action="store_true",
                    help="add a condition with the grader running --sandbox-suite's hidden tests in a loop in the "
                         "sandbox (neighbours.SandboxTests)")
    ap.add_argument("--sandbox-suite", default=str(Path(__file__).resolve().parents[1] / "tasks" / "suites" / "smoke"))
    ap.add_argument("--pool-policies", default="",
                    help="comma-separated csrc/pool.h policies to time the engine at besides its default "
                         "(0: one chunk per thread, the pool before it adapted; 1: pieces, always parallel; "
                         "2: pieces, serial or parallel from each region's timings)")
    ap.add_argument("--random-config", default="{}",
                    help="JSON of ModelConfig keys replacing the random model's (BENCH_CONFIG), e.g. "
                         "'{\"num_hidden_layers\": 16}'")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the engine and transformers decode (cuda: the engine's PyTorch path; module docstring)")
    args = ap.parse_args()
    if not 1 <= args.b1_prompts <= args.batch:
        ap.error(f"--b1-prompts must be between 1 and --batch ({args.batch}), got {args.b1_prompts}")
    try:
        policies = [int(p) for p in args.pool_policies.split(",") if p.strip()]
    except ValueError:
        ap.error(f"--pool-policies takes comma-separated integers (0, 1, 2), got {args.pool_policies!r}")
    if any(p not in (0, 1, 2) for p in policies):
        ap.error(f"--pool-policies: the policies besides the default (3) are 0, 1 and 2, got {policies}")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            ap.error(f"--device cuda: torch {torch.__version__} sees no CUDA device")
        cpu_only = [flag for flag, on in (("--background-load", args.background_load),
                                          ("--sandbox-load", args.sandbox_load), ("--pool-policies", policies)) if on]
        if cpu_only:
            ap.error(f"{', '.join(cpu_only)}: CPU conditions; leave them out with --device cuda")
        args.skip_torch_path = True  # on a GPU the engine's only path
    if args.sandbox_load and not Path(args.sandbox_suite, "suite.toml").is_file():
        ap.error(f"--sandbox-suite {args.sandbox_suite}: no suite.toml there")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        model = load_pretrained(args.model, dtype=torch.float32)
    else:
        model = Transformer(ModelConfig(**{**BENCH_CONFIG, **json.loads(args.random_config)})).eval()
    model = model.to(device)
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    mtp_params = sum(p.numel() for p in model.mtp.parameters())
    if args.prompt_len is None:
        args.prompt_len = 256 if args.prompts else 32
    if args.prompts:
        prompts = trajectory_prompts(args.prompts, args.tokenizer or args.model or "", args.batch, args.prompt_len)
    else:
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
    max_len = args.prompt_len + args.new_tokens + 8
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "prompts": args.prompts or "random", "params": params, "params_without_mtp": params - mtp_params, "threads": args.threads,
           "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "batch": args.batch,
           "b1_prompts": args.b1_prompts}

    def engine(**kw) -> Engine:
        return Engine(copy.deepcopy(model), max_slots=args.batch, max_len=max_len,
                      **{"num_threads": args.threads, **kw})

    runners = {"engine": EngineRunner(engine(), args.new_tokens)}
    if device.type == "cpu":  # a thread count means nothing to a GPU's engine
        runners["engine_1t"] = EngineRunner(engine(num_threads=1), args.new_tokens)
    torch.set_num_threads(args.threads)  # this thread's (transformers'): the engines set their own
    if policies and not runners["engine"].engine.native:
        raise SystemExit(f"--pool-policies: the engine's C++ kernels are unavailable ({native.unavailable_reason()})")
    for p in policies:
        runners[f"engine_policy{p}"] = PoolPolicyRunner(EngineRunner(runners["engine"].engine, args.new_tokens), p)
    if not args.skip_torch_path:
        runners["torch_path"] = EngineRunner(engine(native_kernels=False), args.new_tokens)
    spec_depth = cfg.num_mtp_modules if args.spec_depth is None else args.spec_depth
    if spec_depth:
        runners["spec"] = EngineRunner(engine(speculative_depth=spec_depth), args.new_tokens)
    if args.prompts and "spec" in runners:
        # Agent turns: both stop where the policy ends its turn, as in the agent loop.
        from opencomposer.model.chat import stop_token_ids
        from opencomposer.model.tokenizer import Tokenizer

        stop = tuple(stop_token_ids(Tokenizer.load(args.tokenizer or args.model)))
        runners["engine_turns"] = EngineRunner(runners["engine"].engine, args.new_tokens, stop)
        runners["spec_turns"] = EngineRunner(runners["spec"].engine, args.new_tokens, stop)
    if args.oracle_drafts and spec_depth:
        # The reference outputs: the plain engine's, per prompt (batch B covers batch 1's prompt).
        for stop_tag, plain in (("", "engine"), ("_turns", "engine_turns")):
            if plain not in runners:
                continue
            reference = {tuple(p): r.output_ids for p, r in zip(prompts, runners[plain].generate(prompts))}
            oracle = OracleDraftEngine(copy.deepcopy(model), reference, max_slots=args.batch, max_len=max_len,
                                       speculative_depth=spec_depth, num_threads=args.threads)
            runners[f"oracle{stop_tag}"] = EngineRunner(oracle, args.new_tokens, runners[plain].stop)
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_transformers:
        save_pretrained(model, tmp.name)
        runners["transformers"] = TransformersRunner(tmp.name, args.new_tokens, device)
    batches = {1: OneByOne(prompts[:args.b1_prompts]), args.batch: prompts}

    # Under load: the engine (default, one thread, other pool policies) and transformers, each
    # condition with runners of its own (their records) over the same engines.
    def loaded_runners() -> dict:
        own = {"engine": EngineRunner(runners["engine"].engine, args.new_tokens),
               "engine_1t": EngineRunner(runners["engine_1t"].engine, args.new_tokens)}
        for p in policies:
            own[f"engine_policy{p}"] = PoolPolicyRunner(EngineRunner(runners["engine"].engine, args.new_tokens), p)
        if "transformers" in runners:
            own["transformers"] = runners["transformers"]
        return own

    from neighbours import BusyCores, SandboxTests  # benchmarks/, this script's folder

    conditions, neighbours = {"quiet": runners}, {}
    load_before = os.getloadavg()
    try:
        if args.background_load:
            neighbours[f"busy{args.background_load}"] = BusyCores(args.background_load)
        if args.sandbox_load:
            neighbours["sandbox"] = SandboxTests(args.sandbox_suite)
        for cond in neighbours:
            conditions[cond] = loaded_runners()
        tps, outputs, rates = interleaved(conditions, neighbours, batches, args.repeats, device)
    finally:
        for n in neighbours.values():
            n.stop()
    tmp.cleanup()
    out.update(native=runners["engine"].engine.native, load_average_before=load_before,
               load_average_after=os.getloadavg(),
               neighbours={c: n.describe() for c, n in neighbours.items()})

    context = args.prompt_len + args.new_tokens / 2
    used = routed_experts_per_layer(model, prompts)
    nbytes, flops = step_cost(model, args.batch, context, used)
    out.update(step_bytes=nbytes, step_flops=flops, experts_used_per_layer=used)
    out["conditions"] = {c: condition_figures(rs, tps[c], outputs[c], batches, rates[c], nbytes, flops, args.batch)
                         for c, rs in conditions.items()}
    out.update(out["conditions"]["quiet"])
    tps, outputs = tps["quiet"], outputs["quiet"]
    if "torch_path" in runners:
        for B in batches:
            out[f"engine_torch_path_tps_b{B}"] = tps["torch_path", B]
        out["engine_torch_path_step_ms"] = 1e3 * statistics.median(runners["torch_path"].step_s[args.batch])
    lag_med, lag_max = asyncio.run(event_loop_lag(runners["engine"].engine, prompts, args.new_tokens))
    out.update(event_loop_lag_ms_median=lag_med, event_loop_lag_ms_max=lag_max)

    for spec, plain, tag in (("spec", "engine", "spec"), ("spec_turns", "engine_turns", "turns_spec"),
                             ("oracle", "engine", "oracle"), ("oracle_turns", "engine_turns", "turns_oracle")):
        if spec not in runners:
            continue
        r = runners[spec]
        out["spec_depth"] = spec_depth
        out[f"{tag}_acceptance"] = r.accepted / max(r.proposed, 1)
        out[f"{tag}_tokens_per_step"] = 1 + spec_depth * out[f"{tag}_acceptance"]
        for B in batches:
            out[f"{tag}_tps_b{B}"] = tps[spec, B]
            out[f"{tag}_ratio_b{B}"] = tps[spec, B] / tps[plain, B]
            out[f"{tag}_decode_ratio_b{B}"] = r.decode_tps(B) / runners[plain].decode_tps(B)
            out[f"{tag}_same_as_plain_b{B}"] = outputs[spec, B] == outputs[plain, B]
            if tag.startswith("turns"):
                out[f"turns_plain_tps_b{B}"] = tps[plain, B]
                out[f"turns_mean_new_tokens_b{B}"] = statistics.mean(map(len, outputs[plain, B]))
    for run in runners.values():
        if isinstance(run, EngineRunner):
            run.engine.stop()

    if args.json:
        print(json.dumps(out, indent=2))
        return
    B = args.batch
    print(f"model: {params / 1e6:.1f}M parameters ({(params - mtp_params) / 1e6:.1f}M without MTP), "
          f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}; {args.threads} threads; "
          f"prompts {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, float32; batch 1: "
          f"{args.b1_prompts} prompt(s) one after another")
    on = f"device: {out['device']}; " if device.type == "cuda" else ""
    print(on + f"machine: read bandwidth {out['bandwidth_GBps']:.1f} GB/s, "
          f"fp32 matmul {out['matmul_GFLOPs']:.0f} GFLOP/s; "
          f"load average {out['load_average_before'][0]:.2f} before, {out['load_average_after'][0]:.2f} after")
    for cond, fig in out["conditions"].items():
        print(f"{cond}" + (f" ({out['neighbours'][cond]})" if cond in out["neighbours"] else "") +
              f": pool regions {fig['pool_parallel_regions']} parallel, {fig['pool_serial_regions']} serial, "
              f"{fig['pool_backoffs']} back-offs, {fig['pool_capped_regions']} on fewer threads (busy CPUs); {100 * fig['fraction_of_limit']:.0f}% of the limit")
        for b in (1, B):
            line = f"  batch {b:>2}: engine {fig[f'engine_tps_b{b}']:8.0f} tok/s"
            if f"engine_1t_tps_b{b}" in fig:
                line += f"   one thread {fig[f'engine_1t_tps_b{b}']:7.0f} (x{fig[f'engine_vs_1t_b{b}']:.2f})"
            for p in policies:
                line += f"   policy {p} {fig[f'engine_policy{p}_tps_b{b}']:7.0f}"
            if f"transformers_tps_b{b}" in fig:
                line += (f"   transformers {fig[f'transformers_tps_b{b}']:7.0f} tok/s   x{fig[f'speedup_b{b}']:.1f}"
                         f"   same outputs {fig[f'same_outputs_b{b}']}")
            print(line)
    if "engine_torch_path_step_ms" in out:
        print(f"engine without its C++ kernels (native_kernels=False: oneDNN + fused.py): batch 1 "
              f"{out['engine_torch_path_tps_b1']:.0f} tok/s, batch {B} {out[f'engine_torch_path_tps_b{B}']:.0f} tok/s, "
              f"step {out['engine_torch_path_step_ms']:.2f} ms")
    print(f"batch {B} decode step: {out[f'engine_step_ms_b{B}']:.2f} ms measured, limit {out['limit_step_ms']:.2f} ms "
          f"({out['limit_bound']}-bound: {nbytes / 1e6:.1f} MB, {flops / 1e6:.0f} MFLOP; experts used per layer "
          f"{used}) -> {100 * out['fraction_of_limit']:.0f}% of the limit")
    print(f"event loop lag while decoding: median {lag_med:.2f} ms, max {lag_max:.1f} ms")
    for tag, what in (("spec", f"{args.new_tokens} new tokens"), ("turns_spec", "agent turns (stop at the turn's end)"),
                      ("oracle", f"{args.new_tokens} new tokens, every draft accepted (the ceiling)"),
                      ("turns_oracle", "agent turns, every draft accepted (the ceiling)")):
        if f"{tag}_acceptance" not in out:
            continue
        print(f"MTP speculative (depth {out['spec_depth']}), {what}: acceptance {out[f'{tag}_acceptance']:.2f}, "
              f"{out[f'{tag}_tokens_per_step']:.2f} tokens per verify step")
        for b in (1, B):
            line = f"batch {b:>2}: speculative {out[f'{tag}_tps_b{b}']:8.0f} tok/s"
            if tag.startswith("turns"):
                line += (f" (plain {out[f'turns_plain_tps_b{b}']:.0f}; "
                         f"{out[f'turns_mean_new_tokens_b{b}']:.0f} new tokens per turn on average)")
            print(line + f", x{out[f'{tag}_ratio_b{b}']:.2f} of plain (decode phase alone "
                  f"x{out[f'{tag}_decode_ratio_b{b}']:.2f}), same output as plain: {out[f'{tag}_same_as_plain_b{b}']}")


if __name__ == "__main__":
    main()
