"""Single-turn RL: a dataset of prompts, Python reward functions, the same trainer as the agentic mode.

The simplest RL job, shaped as TRL's GRPOTrainer and verifiers take it: prompts (a JSONL file
or a list) and reward functions `f(prompt, completion, **kw) -> float` named "module:function"
in the config. Each step:

  1. the data cursor issues `groups_per_step` prompt ids (single epoch: each prompt once);
  2. the embedded engine samples G completions per prompt in one continuous batch, with
     behaviour logprobs and routed experts (prompt and completion), each request seeded from
     (run.seed, prompt id, sample index) so a resumed run samples what the original would;
  3. reward = Σ weight·f(prompt, completion, **fields, **kwargs, prompt_ids=..., completion_ids=...)
     (fields: the prompt's other dataset fields, e.g. an answer); reward functions must accept
     **kw, as TRL's do;
  4. Trainer.step on the G-sample groups (KL-in-reward, Dr. GRPO, router replay, clipped loss);
  5. weight sync into the engine in place (delta: changed tensors only);
  6. metrics to <out_dir>/metrics.jsonl and TensorBoard; a checkpoint every N steps.

`run_single_turn(cfg, resume=...)` is what `opencomposer rl --config FILE` calls for
mode: single_turn. Left out: chat templates (prompts are raw text after <|bos|>), generation
on a remote server (weight_sync.mode "disk" is for the agentic mode's servers), and reward
functions that take batches (wrap one in a per-sample function).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from opencomposer.engine.types import GenerationRequest, GenerationResult, SamplingParams, behaviour_logprobs_mode
from opencomposer.errors import ConfigError, InferenceError
from opencomposer.model.tokenizer import Tokenizer
from opencomposer.rl.buffer import DataCursor, Group, GroupBuffer, Sample
from opencomposer.rl.config import RewardFunctionConfig, RLConfig
from opencomposer.rl.run import Run, build_trainer, embedded_inference

RewardFn = Callable[..., float]


# ---- data and rewards -------------------------------------------------------------------------

@dataclass
class Prompt:
    id: str
    text: str
    fields: dict[str, Any] = field(default_factory=dict)


def load_prompts(source: str | Path | Sequence[str | dict], prompt_field: str = "prompt",
                 id_field: str = "id") -> list[Prompt]:
    """Prompts from a JSONL file or a list of strings/objects; ids default to the row number."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"data.prompts: {path} does not exist (a JSONL file, one object per line)")
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"data.prompts: {path}:{n} is not valid JSON: {e}") from e
    else:
        rows = list(source)
    prompts = []
    for i, row in enumerate(rows):
        if isinstance(row, str):
            row = {prompt_field: row}
        if not isinstance(row, dict) or not isinstance(row.get(prompt_field), str):
            raise ConfigError(f"data.prompts: row {i} has no string field {prompt_field!r} (data.prompt_field)")
        fields = {k: v for k, v in row.items() if k not in (prompt_field, id_field)}
        prompts.append(Prompt(str(row.get(id_field, i)), row[prompt_field], fields))
    if not prompts:
        raise ConfigError("data.prompts is empty")
    return prompts


def import_function(spec: str) -> RewardFn:
    """"package.module:function" -> the function; ConfigError naming what is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"reward function {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"reward function {spec!r}: cannot import {module_name}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward function {spec!r}: {module_name} has no function {attr!r}")
    return fn


@dataclass
class RewardFunction:
    name: str
    fn: RewardFn
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)


def load_reward_functions(specs: Sequence[RewardFunctionConfig | str | RewardFn]) -> list[RewardFunction]:
    out = []
    for spec in specs:
        if callable(spec):
            out.append(RewardFunction(getattr(spec, "__name__", "reward"), spec))
        else:
            spec = RewardFunctionConfig(fn=spec) if isinstance(spec, str) else spec
            out.append(RewardFunction(spec.fn.rpartition(":")[2], import_function(spec.fn), spec.weight, spec.kwargs))
    return out


def score(fns: Sequence[RewardFunction], prompt: Prompt, completion: str, prompt_ids: list[int],
          completion_ids: list[int]) -> tuple[float, dict[str, float]]:
    """Σ weight·f(...) and each f's value (for metrics)."""
    total, parts = 0.0, {}
    for rf in fns:
        kw = {**prompt.fields, **rf.kwargs, "prompt_ids": prompt_ids, "completion_ids": completion_ids}
        try:
            value = rf.fn(prompt.text, completion, **kw)
        except Exception as e:
            raise ConfigError(f"reward function {rf.name} raised {e!r} on prompt {prompt.id!r}; reward "
                              f"functions take (prompt, completion, **kw) and return a float") from e
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"reward function {rf.name} returned {value!r} on prompt {prompt.id!r}; expected a finite float")
        parts[rf.name] = float(value)
        total += rf.weight * float(value)
    return total, parts


# Example reward functions (the tiny config and the tests use them).

def digit_fraction(prompt: str, completion: str, **kw) -> float:
    """Fraction of the completion's non-space characters that are digits."""
    chars = [c for c in completion if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def token_range_fraction(prompt: str, completion: str, *, completion_ids: Sequence[int], lo: int, hi: int,
                         **kw) -> float:
    """Fraction of completion tokens with lo ≤ id < hi (a toy reward any tokenizer can learn)."""
    return sum(lo <= t < hi for t in completion_ids) / len(completion_ids) if completion_ids else 0.0


# ---- rollouts -----------------------------------------------------------------------------------

def request_seed(run_seed: int, task_id: str, index: int) -> int:
    """Per-request sampling seed from (run seed, task, sample index): independent of batching and resumes."""
    digest = hashlib.sha256(f"{run_seed}:{task_id}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def sample_from_result(result: GenerationResult, reward: float, group_id: str, task_id: str,
                       moe_shape: tuple[int, int] | None, info: dict | None = None) -> Sample:
    """One engine result -> a Sample (buffer.py's layout): the prompt is context, the completion is trained.

    Routed experts of input positions: the prompt's rows, then output rows 1.. (row j of the
    output is input position P−1+j, so row 0 repeats the prompt's last); the last token is never
    an input to a forward whose output is trained, so its row is −1.
    """
    P, O = len(result.prompt_ids), len(result.output_ids)
    tokens = np.asarray(result.prompt_ids + result.output_ids, dtype=np.int64)
    mask = np.zeros(P + O, dtype=bool)
    mask[P:] = True
    behav = np.zeros(P + O, dtype=np.float32)
    behav[P:] = result.logprobs
    versions = np.full(P + O, -1, dtype=np.int64)
    versions[P:] = result.policy_versions
    routed = None
    if moe_shape is not None and result.routed_experts is not None and result.prompt_routed_experts is not None:
        routed = np.concatenate([result.prompt_routed_experts, result.routed_experts[1:],
                                 np.full((1, *moe_shape), -1, dtype=np.int32)]).astype(np.int32)
    return Sample(tokens, mask, behav, reward, group_id, task_id, routed, versions, info or {})


def generate_groups(engine: Any, tokenizer: Tokenizer, prompts: Sequence[Prompt], fns: Sequence[RewardFunction],
                    cfg: RLConfig, step: int) -> list[Group]:
    """G completions per prompt in one engine batch, scored into Groups."""
    sc, G = cfg.sampling, cfg.data.group_size
    stop = (tokenizer.eos_id,) if sc.stop_at_eos and tokenizer.eos_id is not None else ()
    replay = cfg.train.router_replay and bool(engine.model.config.moe_layers)
    requests, owners = [], []
    for p in prompts:
        ids = encode_prompt(tokenizer, p.text, cfg.data.add_bos)
        for j in range(G):
            sp = SamplingParams(temperature=sc.temperature, top_p=sc.top_p, top_k=sc.top_k,
                                max_new_tokens=sc.max_new_tokens, stop_token_ids=stop,
                                seed=request_seed(cfg.run.seed, p.id, j))
            requests.append(GenerationRequest(ids, sp, return_logprob=True, return_routed_experts=replay,
                                              return_prompt_routed_experts=replay,
                                              logprobs_mode=behaviour_logprobs_mode(sp)))
            owners.append(p)
    results = engine.generate_batch(requests)
    mcfg = engine.model.config
    moe_shape = (len(mcfg.moe_layers), mcfg.num_experts_per_tok) if replay else None
    by_prompt: dict[str, list[Sample]] = {p.id: [] for p in prompts}
    for p, r in zip(owners, results):
        if r.finish_reason == "abort" or not r.output_ids:
            continue  # the group is one short; Dr. GRPO handles ragged groups
        text = tokenizer.decode(r.output_ids, skip_special=True)
        reward, parts = score(fns, p, text, r.prompt_ids, r.output_ids)
        by_prompt[p.id].append(sample_from_result(r, reward, f"{p.id}@{step}", p.id, moe_shape,
                                                  {"rewards": parts, "finish_reason": r.finish_reason}))
    return [Group(f"{p.id}@{step}", p.id, by_prompt[p.id]) for p in prompts if by_prompt[p.id]]


def encode_prompt(tokenizer: Tokenizer, text: str, add_bos: bool) -> list[int]:
    ids = tokenizer.encode(text)
    return ([tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []) + ids


# ---- the run ------------------------------------------------------------------------------------

def run_single_turn(cfg: RLConfig, *, resume: bool = False, prompts: Sequence[Prompt] | None = None,
                    reward_fns: Sequence[RewardFn] | None = None,
                    on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Train until the prompts run out or train.max_steps; returns a summary.

    prompts / reward_fns override the config's (for Python callers and tests). resume: continue
    from the latest checkpoint in <out_dir>/checkpoints (a fresh start if there is none yet).
    The set-up every mode shares (run directory, policy, reference, trainer, engine, metrics,
    checkpoints) is rl/run.py's; this function keeps the data and the loop.
    """
    if cfg.weight_sync.mode != "in_place":
        raise ConfigError("single-turn mode generates with the embedded engine: weight_sync.mode must be "
                          "'in_place' ('disk' is for remote inference servers)")
    run = Run.open(cfg, resume, on_step)
    tokenizer = run.tokenizer
    data = list(prompts) if prompts is not None else load_prompts(cfg.data.prompts, cfg.data.prompt_field,
                                                                   cfg.data.id_field)
    by_id = {p.id: p for p in data}
    fns = load_reward_functions(reward_fns if reward_fns is not None else cfg.data.rewards)
    longest = max(len(encode_prompt(tokenizer, p.text, cfg.data.add_bos)) for p in data)
    if longest + cfg.sampling.max_new_tokens > cfg.engine.max_len:
        raise ConfigError(f"the longest prompt ({longest} tokens) + sampling.max_new_tokens "
                          f"({cfg.sampling.max_new_tokens}) exceed engine.max_len ({cfg.engine.max_len})")

    trainer = build_trainer(cfg, run.state, tokenizer)
    cursor = DataCursor([p.id for p in data], cfg.run.seed, cfg.data.shuffle)
    buffer = GroupBuffer()
    if run.state is not None:
        buffer.load_state_dict(run.state.buffer)
        cursor.load_state_dict(run.state.cursor, buffer.task_ids())
    run.snapshot = lambda step: dict(model=trainer.model, trainer_state=trainer.state_dict(), version=trainer.version,
                                     cursor=cursor.state_dict(), buffer=buffer.state_dict())
    inference = embedded_inference(cfg, trainer, tokenizer, run.dir)
    engine, model = inference.engine, trainer.model
    run.open_metrics()

    step = run.start_step
    total_steps = cfg.train.max_steps or (step + math.ceil((cursor.remaining + len(cursor.in_flight))
                                                           / cfg.data.groups_per_step))
    progress = _progress(cfg.log.progress, total_steps, step)
    t_run = time.perf_counter()
    try:
        while cfg.train.max_steps is None or step < cfg.train.max_steps:
            t0 = time.perf_counter()
            groups = buffer.take(cfg.data.groups_per_step)
            need = cfg.data.groups_per_step - len(groups)
            ids = cursor.next(need) if need else []
            if not groups and not ids:
                break
            groups += generate_groups(engine, tokenizer, [by_id[i] for i in ids], fns, cfg, step)
            lost = set(ids) - {g.task_id for g in groups}
            cursor.release(lost)  # every completion aborted: try the prompt again later
            # Nothing is decoding until the next step's first request restarts it: stop the scheduler
            # thread so that its OpenMP team goes too. With a second team alive libgomp counts more
            # threads than cores and cuts every team's spin-wait short, and the train step's many small
            # parallel regions each pay a futex wake-up: measured on 2 cores, 20-40% slower steps.
            engine.stop()
            t_gen = time.perf_counter() - t0
            if not groups:
                raise InferenceError(f"the engine finished no completion for prompts {ids[:5]}: every request "
                                     f"was aborted (see the engine's log)")
            metrics = trainer.step(groups)
            cursor.mark_trained(g.task_id for g in groups)
            stats = inference.sync.sync(model, trainer.version)
            step += 1
            completion_tokens = sum(s.num_generated for g in groups for s in g.samples)
            dt = time.perf_counter() - t0
            metrics.update(stats.as_metrics())
            metrics.update({"gen/time_s": t_gen, "gen/completion_tokens": float(completion_tokens),
                            "gen/tokens_per_s": completion_tokens / max(t_gen, 1e-9),
                            "step/time_s": dt, "step/completion_tokens_per_s": completion_tokens / dt,
                            "data/trained": float(len(cursor.trained)), "data/remaining": float(cursor.remaining)})
            run.end_step(step, metrics)
            if progress is not None:
                progress[0].update(progress[1], completed=step,
                                   description=f"step {step} reward {metrics['reward/mean']:.3f}")
        run.finish(step)
    finally:
        if progress is not None:
            progress[0].stop()
        run.close()
        engine.stop()
    return {"run_dir": str(run.dir), "steps": step, "policy_version": trainer.version,
            "trained": list(cursor.trained), "seconds": time.perf_counter() - t_run}


def _progress(enabled: bool, total: int, done: int):
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True))  # stdout is left for the run's JSON summary
    task = progress.add_task(f"step {done}", total=total, completed=done)
    progress.start()
    return progress, task
