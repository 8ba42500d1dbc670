"""SFT on agent trajectories: the report's short supervised phase between pretraining and RL.

Data. The oracle policy (by default the demo family's `ReadEditOracle`: read the file, then
one minimal edit_file; with `data.decoy_rate` an imperfect demonstrator that writes a plausible
wrong fix on that share of the tasks, `demo_family.demonstrator`) is run through the real agent
loop in a sandbox fork of every task of a training suite (never the held-out suite), with the
environment's agent config (tool set, system prompt, limits): tasks/demonstrations.py collects
them into `<run.out_dir>/sft_data/trajectories.jsonl` (collection resumes: tasks already there are
skipped). Trajectory JSONL files written by anyone else (`opencomposer eval`, RL) can be added
with `data.trajectories`.

Rendering. Each segment of a trajectory becomes one example in the tokenizer's chat format (model/chat.py) and loss
mask RL uses: a token-level segment keeps its own `token_ids` / `loss_mask` (exactly what
the policy saw and sampled); a chat-level one (the oracle's) is encoded with
`chat.encode_with_mask` over the segment's messages and the trajectory's tools, which gives
the ids `_TokenContext` would have built for the same conversation: mask 1 on what the
assistant writes after its role token (including <|im_end|>), 0 on system, user and tool
turns. A trajectory whose meta lists `untaught_turns` (indices of assistant turns, counted over the
whole trajectory) has those turns' tokens masked out too: the demonstrator's way of showing a path
without teaching the choice that opens it (`data.parallel_choice_rate`). Rendered examples are
cached as .npz under a key = hash(trajectory files, tokenizer, max_len), so a second run starts in
milliseconds. Examples longer than `max_len` are dropped (and counted).

Objective, per step over a batch of B examples padded on the right (pads have mask 0):

    L = sum_{t: m_t = 1} -log p(x_t | x_<t) / sum_t m_t          (token mean over the batch)
        + (lambda / D) * sum_k L_k                                   (MTP, optional, on the same mask)

with L_k the MTP loss of pretrain (mtp.py: "ce" or "distill" onto the main head), so the MTP
modules keep drafting well for the SFT policy. Without MTP, the lm_head runs only on masked
positions (most of a trajectory is prompt and tool output). Optimisation, checkpoints and
metrics are pretraining's: AdamW with decay on matrices (`train.make_optimizer`), warmup then
cosine (`train.lr_at`), global-norm clipping, atomic checkpoints (`checkpoint.py`) holding the
model in HF format with tokenizer.json plus the optimizer, the data cursor and RNG state,
metrics.jsonl (training/metrics.py). The final model is published to `<run.out_dir>/model`, which
`opencomposer eval --policy engine:<run.out_dir>/model` serves.

Device: `run.device` (auto: a GPU when torch sees one) holds the model and optimizer; batches are
collated and packed on the host and moved per step. On the CPU nothing moves.

Left out: packing several examples into one sequence (a trajectory's prompt is most of its
tokens, so padding waste is small next to it), distributed SFT (pretraining's DDP path would
carry over), and rejection sampling from the model itself (that is RL's job here).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opencomposer.config import (REQUIRED, CheckpointConfig, LogConfig, OptimConfig, RunConfig, Section, dump_config,
                                 variant)
from opencomposer.config import load_config as _load
from opencomposer.device import ComputeDtype, autocast, resolve_device
from opencomposer.errors import ConfigError
from opencomposer.harness.trajectory import Trajectory, read_jsonl
from opencomposer.model import Transformer, load_pretrained
from opencomposer.model.chat import encode_with_mask
from opencomposer.model.mtp import mtp_loss
from opencomposer.model.export import check_tokenizer
from opencomposer.model.tokenizer import Tokenizer, load_tokenizer
from opencomposer.pretrain import checkpoint as ckpt
from opencomposer.pretrain.config import MTPConfig, PhaseConfig, PretrainOptimConfig
from opencomposer.pretrain.train import lr_at, make_optimizer, open_run_dir, set_lr, use_deterministic_algorithms
from opencomposer.tasks.demonstrations import agent_config, collect_trajectories
from opencomposer.training.allocator import keep_freed_memory
from opencomposer.training.metrics import MetricsWriter
from opencomposer.training.logits import CHUNK_ELEMENTS, head_logprobs
from opencomposer.training.packing import forward_packed, pack
from opencomposer.training.threads import StepThreads

_CACHE_VERSION = 1  # bump when rendering changes meaning
TRAJECTORIES = "trajectories.jsonl"


class GenerateConfig(Section):
    """Generate the training suite with the demo family when it does not exist yet."""

    n: int = Field(gt=0)
    """Tasks to generate."""
    seed: int = 0
    """Generator seed (use another for the held-out suite)."""
    difficulty: int = Field(1, ge=0)
    """Distractor functions per module (demo_family.MAX_DIFFICULTY at most)."""


class SFTDataConfig(Section):
    """Where SFT examples come from."""

    suite: str | None = None
    """A training suite: the oracle is run on each of its tasks through the agent loop."""
    generate: GenerateConfig | None = None
    """If set and `suite` does not exist, generate it with the demo family first."""
    trajectories: list[str] = []
    """Existing trajectory JSONL files (eval or RL output) to train on as well."""
    resolved_only: bool = True
    """Drop trajectories whose grade says unresolved (ungraded ones are kept)."""
    grade: bool = False
    """Grade each oracle trajectory with the hidden tests while collecting (slower; a check)."""
    decoy_rate: float = Field(0.0, ge=0, le=1)
    """Share of the suite's tasks on which the demonstrator writes the task's decoy fix (a plausible
    wrong edit of the named line, demo_family.Bug.decoy) instead of the gold one: an imperfect
    demonstrator, as SFT data from people or models is (demo_family.demonstrator). The choice is a
    hash of `seed` and the task id. With `grade` and `resolved_only` the decoys would be dropped."""
    parallel_rate: float = Field(1.0, ge=0, le=1)
    """Share of the tasks on which the demonstrator batches its calls (the reads in one turn, the
    edits in one turn); on the rest one call a turn, two more turns on a two-file task
    (demo_family.demonstrator's habits; the length penalty's turn term can teach them away)."""
    verify_rate: float = Field(0.0, ge=0, le=1)
    """Share of the tasks on which the demonstrator reads the edited file again before answering
    (one needless turn)."""
    parallel_choice_rate: float = Field(1.0, ge=0, le=1)
    """Share of the batching demonstrations whose first turn (the batched reads) is in the loss; on
    the rest SFT learns what follows the batched reads, not the choice to batch them
    (demo_family.demonstrator): a policy that rarely batches but completes the batched path."""
    survey_rate: float = Field(0.0, ge=0, le=1)
    """Share of the tasks on which the demonstrator first reads the package's __init__.py in a turn
    of its own (one needless turn before the reads, demo_family.surveys)."""
    habit_tasks: Literal["all", "one_file"] = "all"
    """Which tasks the re-read and the survey may fall on: "one_file" keeps them off two-file tasks,
    whose only needless turns are then the unbatched calls (demo_family.teacher_habits)."""
    agent: str | dict[str, Any] | None = None
    """AgentConfig YAML file or inline fields for collection; null: the demo's (demo_family.DEMO_AGENT)."""
    concurrency: int = Field(2, ge=1)
    """Oracle episodes run at once while collecting."""
    max_len: int = Field(1024, gt=1)
    """Longer examples are dropped."""
    val_examples: int = Field(8, ge=0)
    """Examples held out (after a seeded shuffle) for the validation loss."""
    cache_dir: str = "~/.cache/opencomposer/sft"
    """Where rendered examples are cached (.npz keyed by content)."""

    @model_validator(mode="after")
    def _collection_needs_a_suite(self) -> "SFTDataConfig":
        # these fields shape the demonstrator's collection, which only a suite starts
        unused = [k for k in ("generate", "grade", "decoy_rate", "parallel_rate", "verify_rate", "parallel_choice_rate",
                              "survey_rate", "habit_tasks", "agent", "concurrency")
                  if getattr(self, k) != type(self).model_fields[k].default]
        if self.suite is None and unused:
            raise ValueError(f"data.{', data.'.join(unused)}: used only when collecting on data.suite, which is not set")
        return self


SFTRunConfig = variant(RunConfig, "SFTRunConfig", out_dir=REQUIRED,
                       doc="Where the run writes (checkpoints, metrics.jsonl, sft_data/, model/) and how it is seeded.")
SFTOptimConfig = variant(OptimConfig, "SFTOptimConfig", lr=1e-3, betas=PretrainOptimConfig.model_fields["betas"].default,
                         weight_decay=0.0, warmup_steps=10, min_lr_ratio=0.1,
                         doc="AdamW (pretraining's betas), linear warm-up, cosine decay to lr x min_lr_ratio.")
SFTCheckpointConfig = variant(CheckpointConfig, "SFTCheckpointConfig", every_steps=50, keep_last=2)
SFTLogConfig = variant(LogConfig, "SFTLogConfig", drop=("tensorboard", "progress"),
                       doc="A printed line every log.every_steps steps (metrics.jsonl gets every step; the bar always shows).")

RENAMED = {"run_dir": "run.out_dir", "seed": "run.seed", "threads": "run.num_threads", "device": "run.device",
           "lr": "optim.lr", "warmup_steps": "optim.warmup_steps", "min_lr_ratio": "optim.min_lr_ratio",
           "checkpoint_every": "checkpoint.every_steps", "keep_checkpoints": "checkpoint.keep_last",
           "log_every": "log.every_steps"}
"""Keys of older SFT configs and their replacements (a config holding one stops, naming it)."""


class SFTConfig(Section):
    """One SFT run."""

    run: SFTRunConfig
    """Run directory (required), seed (example order, validation split), threads, device (model and optimizer)."""
    init_from: str
    """The HF checkpoint directory to fine-tune (e.g. a pretraining run's model/)."""
    tokenizer: str | None = None
    """tokenizer.json or its directory; null: init_from's own, else the bundled one."""
    data: SFTDataConfig = SFTDataConfig()
    """The examples."""
    steps: int = Field(gt=0)
    """Optimizer steps."""
    batch_size: int = Field(8, gt=0)
    """Examples per step."""
    optim: SFTOptimConfig = SFTOptimConfig()
    """AdamW and the learning-rate schedule (min_lr_ratio null: constant after the warm-up)."""
    mtp: MTPConfig | None = MTPConfig(mode="distill", weight=0.3)
    """MTP loss on the same mask (null: main loss only; ignored for a model without MTP modules)."""
    checkpoint: SFTCheckpointConfig = SFTCheckpointConfig()
    """A resumable checkpoint every checkpoint.every_steps steps (and at the end); keep_last kept."""
    eval_every: int = Field(25, gt=0)
    """Validation loss every N steps (and at the end)."""
    log: SFTLogConfig = SFTLogConfig()
    """The printed progress lines."""
    dtype: ComputeDtype = "float32"
    """Compute dtype of the training steps: bfloat16 autocasts the matmuls and attention (weights, optimizer,
    norms and the loss's softmax stay float32; the validation loss is computed in float32; on a CPU
    attention's kernel computes in float32, its bfloat16 backward being ~4x slower)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: a resumed run repeats the uninterrupted one."""

    @property
    def phase(self) -> PhaseConfig:
        """The run as one pretraining phase, for `lr_at`."""
        o = self.optim
        return PhaseConfig(name="sft", steps=self.steps, seq_len=self.data.max_len, batch_size=self.batch_size,
                           lr=o.lr, warmup_steps=o.warmup_steps,
                           min_lr_ratio=1.0 if o.min_lr_ratio is None else o.min_lr_ratio)

    @property
    def phases(self) -> list[PhaseConfig]:
        return [self.phase]  # what train.make_optimizer reads


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                data: dict[str, Any] | None = None) -> SFTConfig:
    """Read an SFT YAML file (or take `data`), apply `--set key.sub=value` overrides, validate.
    ConfigError names bad fields, and the new name of a key from an older config."""
    return _load(SFTConfig, path, overrides, data, renamed=RENAMED)


# ----------------------------------------------------------------------------- rendering

def render(traj: Trajectory, tok: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) per segment, as RL sees them, less the trajectory's untaught turns
    (module docstring)."""
    untaught, turn, out = set(traj.meta.get("untaught_turns", [])), 0, []
    for seg in traj.segments:
        if seg.token_ids is not None and seg.loss_mask is not None:
            if untaught:
                raise ConfigError(f"{traj.trajectory_id}: untaught_turns on a token-level segment (only the "
                                  "demonstrator's chat-level trajectories carry them)")
            out.append((list(seg.token_ids), [int(m) for m in seg.loss_mask]))
            continue
        ids, mask = encode_with_mask(tok, seg.messages, traj.tools)
        for i, msg in enumerate(seg.messages):
            if msg["role"] != "assistant":
                continue
            if turn in untaught:  # the turn's tokens: what encoding the conversation up to it adds
                a = len(encode_with_mask(tok, seg.messages[:i], traj.tools)[0])
                b_ids = encode_with_mask(tok, seg.messages[:i + 1], traj.tools)[0]
                if ids[:len(b_ids)] != b_ids:
                    raise ConfigError(f"{traj.trajectory_id}: the chat format does not encode a conversation's "
                                      "prefix as the prefix of its ids; untaught_turns cannot be masked")
                mask[a:len(b_ids)] = [0] * (len(b_ids) - a)
            turn += 1
        out.append((ids, mask))
    return out


def _first_turn_batches(traj: Trajectory) -> bool:
    """Whether the trajectory's first reading turn (its first assistant turn, or its second after a
    survey's read of __init__.py) makes more than one call."""
    turns = [m for seg in traj.segments for m in seg.messages if m["role"] == "assistant"]
    i = int(traj.meta.get("survey", False))
    first = turns[i] if len(turns) > i else {}
    return len(first.get("tool_calls") or []) > 1


def _keep(traj: Trajectory, resolved_only: bool) -> bool:
    if traj.stop_reason == "error":
        return False
    return not (resolved_only and traj.grade is not None and not traj.grade.get("resolved", False))


class Examples:
    """Rendered examples: ids and mask concatenated, with offsets (one .npz in the cache)."""

    def __init__(self, ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray, meta: dict):
        self.ids, self.mask, self.offsets, self.meta = ids, mask, offsets, meta

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.ids[a:b], self.mask[a:b]

    @classmethod
    def build(cls, files: list[Path], tok: Tokenizer, max_len: int, cache_dir: str | Path,
              resolved_only: bool = True) -> "Examples":
        h = hashlib.sha256(f"v{_CACHE_VERSION}/{max_len}/{resolved_only}".encode())
        h.update(hashlib.sha256(tok.hf.to_str().encode()).digest())
        for f in files:
            h.update(hashlib.sha256(Path(f).read_bytes()).digest())
        path = Path(cache_dir).expanduser() / f"sft-{h.hexdigest()[:20]}.npz"
        if path.is_file():
            with np.load(path) as z:
                return cls(z["ids"], z["mask"], z["offsets"], json.loads(str(z["meta"])))
        ids, masks, lengths, dropped, skipped, n_traj = [], [], [], 0, 0, 0
        for f in files:
            for traj in read_jsonl(f):
                if not _keep(traj, resolved_only):
                    skipped += 1
                    continue
                n_traj += 1
                for seg_ids, seg_mask in render(traj, tok):
                    if len(seg_ids) > max_len or not any(seg_mask):
                        dropped += 1
                        continue
                    ids.append(np.asarray(seg_ids, np.int32))
                    masks.append(np.asarray(seg_mask, np.uint8))
                    lengths.append(len(seg_ids))
        if not ids:
            raise ConfigError(f"no SFT examples: {n_traj} trajectories kept, {skipped} skipped (error or unresolved), "
                              f"{dropped} segments over max_len={max_len} tokens or without assistant tokens")
        meta = {"trajectories": n_traj, "skipped_trajectories": skipped, "dropped_segments": dropped,
                "examples": len(ids), "tokens": int(sum(lengths)), "assistant_tokens": int(sum(m.sum() for m in masks)),
                "mean_tokens": float(np.mean(lengths)), "max_tokens": int(max(lengths))}
        ex = cls(np.concatenate(ids), np.concatenate(masks), np.cumsum([0, *lengths]).astype(np.int64), meta)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            np.savez(fh, ids=ex.ids, mask=ex.mask, offsets=ex.offsets, meta=json.dumps(meta))
        os.replace(tmp, path)
        return ex


def collate(examples: list[tuple[np.ndarray, np.ndarray]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, L] right-padded with pad_id, mask [B, L] (0 on pads); L = the longest example."""
    L = max(len(i) for i, _ in examples)
    ids = np.full((len(examples), L), pad_id, np.int64)
    mask = np.zeros((len(examples), L), np.float32)
    for r, (i, m) in enumerate(examples):
        ids[r, :len(i)], mask[r, :len(m)] = i, m
    return torch.from_numpy(ids), torch.from_numpy(mask)


# ----------------------------------------------------------------------------- the loss

def hidden_states(model: Transformer, ids_BL: torch.Tensor, lengths_B: list[int] | None) -> torch.Tensor:
    """The final hidden states [B, L-1, D] of the inputs ids_BL[:, :-1] (right-padded, on the host),
    computed on the model's device. With the examples' lengths, the batch's common prefix (the
    system turn every example starts with) runs once: training/packing.py's two calls, gathered back
    (exact up to float rounding)."""
    device = model.lm_head.weight.device
    if lengths_B is None:
        return model(ids_BL[:, :-1].to(device), compute_logits=False).hidden
    p = pack([ids_BL[b, :n].numpy() for b, n in enumerate(lengths_B)], [0] * len(lengths_B),
             ids_BL.shape[1] - 1).to(device)
    hidden_ND, _, _ = forward_packed(model, p, compute_logits=False)
    return hidden_ND[p.index_BT]


def sft_loss(model: Transformer, ids_BL: torch.Tensor, mask_BL: torch.Tensor,
             mtp: MTPConfig | None = None, lengths_B: list[int] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The masked next-token loss (+ MTP) of one batch; mask_BL[b, t] = 1 when token t is a target.
    lengths_B (tokens per example) lets the batch's shared prefix run once (`hidden_states`).
    ids_BL and mask_BL come from the host (`collate`); the loss is computed on the model's device."""
    hidden_BTD = hidden_states(model, ids_BL, lengths_B)
    ids_BL, mask_BL = ids_BL.to(hidden_BTD.device), mask_BL.to(hidden_BTD.device)
    x_BT, y_BT, m_BT = ids_BL[:, :-1], ids_BL[:, 1:], mask_BL[:, 1:]
    use_mtp = mtp is not None and mtp.weight > 0 and len(model.mtp) > 0 and x_BT.shape[1] > 2
    out_logits = model.lm_head(hidden_BTD) if use_mtp else None
    sel_BT = m_BT > 0
    n_targets = int(sel_BT.sum())
    if use_mtp or n_targets * model.config.vocab_size <= CHUNK_ELEMENTS:
        logits_NV = out_logits[sel_BT] if use_mtp else model.lm_head(hidden_BTD[sel_BT])
        main = F.cross_entropy(logits_NV.float(), y_BT[sel_BT])
    else:  # a large vocabulary: the head in chunks (training/logits.py)
        logp_N, _ = head_logprobs(model.lm_head, hidden_BTD[sel_BT], torch.arange(n_targets, device=sel_BT.device),
                                  y_BT[sel_BT])
        main = -logp_N.mean()
    stats = {"loss_main": float(main.detach()), "targets": int(sel_BT.sum())}
    if not use_mtp:
        return main, stats
    hidden = hidden_BTD.detach() if mtp.detach else hidden_BTD
    # depth k's targets are x[:, k+1:]; x[:, t] is a target of the SFT loss iff mask[:, t] = 1
    weighted, per_depth = mtp_loss(model.mtp_logits(x_BT, hidden), x_BT, mode=mtp.mode, main_logits=out_logits,
                                   weight=mtp.weight, loss_mask=mask_BL[:, :-1])
    stats["loss_mtp"] = float(torch.stack(per_depth).mean().detach()) if per_depth else 0.0
    return main + weighted, stats


@torch.no_grad()
def evaluate(model: Transformer, examples: list[tuple[np.ndarray, np.ndarray]], pad_id: int,
             batch_size: int) -> float:
    """Masked next-token loss over `examples` (token mean)."""
    total, n = 0.0, 0
    for i in range(0, len(examples), batch_size):
        ids, mask = collate(examples[i:i + batch_size], pad_id)
        loss, stats = sft_loss(model, ids, mask, None, [len(x) for x, _ in examples[i:i + batch_size]])
        total, n = total + float(loss) * stats["targets"], n + stats["targets"]
    return total / max(n, 1)


# ----------------------------------------------------------------------------- the run

def prepare_data(cfg: SFTConfig, tok: Tokenizer, console: Console, backend=None) -> Examples:
    """Generate the suite if asked, collect oracle trajectories on it, render and cache them."""
    d = cfg.data
    files = [Path(f) for f in d.trajectories]
    for f in files:
        if not f.is_file():
            raise ConfigError(f"data.trajectories: {f} does not exist")
    if d.suite:
        suite = Path(d.suite)
        if not (suite / "suite.toml").is_file():
            if d.generate is None:
                raise ConfigError(f"data.suite: {suite} has no suite.toml; generate it (data.generate) or fix the path")
            from opencomposer.tasks.demo_family import generate_tasks

            generate_tasks(d.generate.n, d.generate.seed, suite, difficulty=d.generate.difficulty, suite_name="demo-train")
            console.print(f"generated {d.generate.n} demo tasks in {suite}")
        out = Path(cfg.run.out_dir) / "sft_data" / TRAJECTORIES
        from opencomposer.tasks.demo_family import demonstrator, teacher_habits, teaches_choice, writes_decoy
        from opencomposer.tasks.task import Suite

        tasks = {t.id: t for t in Suite.load(suite).tasks}
        n_tasks = len(tasks)
        collected = read_jsonl(out) if out.is_file() else []
        for traj in collected:  # a resumed collection must keep its teacher
            teacher = (traj.meta.get("decoy", False), traj.meta.get("parallel", True), traj.meta.get("verify", False),
                       traj.meta.get("survey", False), bool(traj.meta.get("untaught_turns")))
            expected = None  # a task no longer in the suite: another suite's collection
            if traj.task_id in tasks:
                parallel, verify, survey = teacher_habits(tasks[traj.task_id], d.parallel_rate, d.verify_rate,
                                                          d.survey_rate, cfg.run.seed, d.habit_tasks)
                untaught = (parallel and _first_turn_batches(traj)
                            and not teaches_choice(traj.task_id, d.parallel_choice_rate, cfg.run.seed))
                expected = (writes_decoy(traj.task_id, d.decoy_rate, cfg.run.seed), parallel, verify, survey, untaught)
            if teacher != expected:
                raise ConfigError(f"{out} was collected with another data.decoy_rate, parallel_rate, verify_rate, "
                                  f"parallel_choice_rate, survey_rate, habit_tasks, seed or suite ({traj.task_id}); "
                                  f"delete {out.parent} to collect again")
        t0 = time.perf_counter()
        with Progress(TextColumn("oracle trajectories"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            job = bar.add_task("collect", total=n_tasks, completed=len(collected))
            trajs = asyncio.run(collect_trajectories(suite, out, agent_config(d.agent),
                                                     make_policy=demonstrator(d.decoy_rate, cfg.run.seed, d.parallel_rate,
                                                                              d.verify_rate, d.parallel_choice_rate,
                                                                              d.survey_rate, d.habit_tasks),
                                                     concurrency=d.concurrency,
                                                     grade=d.grade, backend=backend,
                                                     on_done=lambda t: bar.advance(job)))
        decoys = sum(t.meta.get("decoy", False) for t in trajs)
        console.print(f"{len(trajs)} oracle trajectories on {suite} in {time.perf_counter() - t0:.1f} s -> {out}"
                      + (f" ({decoys} with the decoy fix, data.decoy_rate {d.decoy_rate})" if d.decoy_rate else ""))
        files.append(out)
    if not files:
        raise ConfigError("no SFT data: set data.suite (oracle trajectories) or data.trajectories (JSONL files)")
    ex = Examples.build(files, tok, d.max_len, d.cache_dir, d.resolved_only)
    m = ex.meta
    console.print(f"SFT data: {m['examples']} examples from {m['trajectories']} trajectories, {m['mean_tokens']:.0f} "
                  f"tokens each on average ({m['assistant_tokens'] / m['examples']:.0f} assistant tokens), "
                  f"{m['dropped_segments']} over max_len dropped")
    return ex


class _ExampleOrder:
    """The training examples in a seeded shuffle per epoch; (epoch, index) is the cursor a checkpoint keeps."""

    def __init__(self, train_idx: np.ndarray, seed: int, epoch: int = 0, index: int = 0):
        self.train_idx, self.seed, self.epoch, self.index = train_idx, seed, epoch, index
        self.perm = self._shuffle()

    def _shuffle(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.train_idx)

    def take(self, n: int) -> list[int]:
        """The next n example indices, going on into the next epoch's order when this one runs out."""
        out = []
        while len(out) < n:
            if self.index >= len(self.perm):
                self.epoch, self.index = self.epoch + 1, 0
                self.perm = self._shuffle()
            out.append(int(self.perm[self.index]))
            self.index += 1
        return out


@dataclass
class _Run:
    """What the loop works on (`_set_up`)."""

    run_dir: Path
    config_yaml: str
    tok: Tokenizer
    data: Examples
    val: list[tuple[np.ndarray, np.ndarray]]
    order: _ExampleOrder
    pad: int
    model: Transformer
    device: torch.device
    optimizer: torch.optim.AdamW
    step: int
    """The step to start from (that of the checkpoint resumed from, else 0)."""
    resumed: bool


def _split(data: Examples, val_examples: int, seed: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """(held-out examples, indices of the training ones) after a seeded shuffle; at most a fifth is held out."""
    order = np.random.default_rng(seed).permutation(len(data))
    n_val = min(val_examples, len(data) // 5)
    return [data[int(i)] for i in order[:n_val]], order[n_val:]


def _load_model(cfg: SFTConfig, found: Path | None, tok: Tokenizer,
                device: torch.device) -> tuple[Transformer, dict[str, Any]]:
    """(model on `device`, trainer state): from the checkpoint `found` with its RNG state restored
    ({} as state), or init_from's."""
    state: dict[str, Any] = {}
    if found is not None:
        state = ckpt.load_trainer_state(found)
        model = load_pretrained(found / "model", dtype=torch.float32)
        torch.set_rng_state(state["rng"])
    else:
        if not Path(cfg.init_from).is_dir():
            raise ConfigError(f"init_from: {cfg.init_from} is not a checkpoint directory (run pretraining first)")
        model = load_pretrained(cfg.init_from, dtype=torch.float32)
    if tok.vocab_size > model.config.vocab_size:
        raise ConfigError(f"the tokenizer has {tok.vocab_size} tokens but the model's vocab_size is "
                          f"{model.config.vocab_size}; set `tokenizer` to the model's own")
    check_tokenizer(tok, model.config, cfg.init_from)  # the chat format's structure tokens
    model.to(device).train()
    return model, state


def _set_up(cfg: SFTConfig, resume: bool, console: Console, backend) -> _Run:
    """Threads, determinism, the run directory, the examples, model and optimizer (resumed from the
    newest checkpoint when there is one)."""
    if cfg.run.num_threads:
        torch.set_num_threads(cfg.run.num_threads)
    keep_freed_memory()
    device = resolve_device(cfg.run.device, "run.device")
    if cfg.deterministic:
        use_deterministic_algorithms()
    run_dir, config_yaml = Path(cfg.run.out_dir), dump_config(cfg)
    found = open_run_dir(run_dir, resume, config_yaml)
    tok = load_tokenizer(cfg.tokenizer, checkpoint=cfg.init_from)
    data = prepare_data(cfg, tok, console, backend)
    val, train_idx = _split(data, cfg.data.val_examples, cfg.run.seed)
    pad = tok.pad_id if tok.pad_id is not None else 0
    model, state = _load_model(cfg, found, tok, device)
    optimizer = make_optimizer(model, cfg)
    if state:
        optimizer.load_state_dict(state["optimizer"])
    order = _ExampleOrder(train_idx, cfg.run.seed, int(state.get("epoch", 0)), int(state.get("index", 0)))
    return _Run(run_dir, config_yaml, tok, data, val, order, pad, model, device, optimizer, int(state.get("step", 0)),
                resumed=found is not None)


def _train_step(r: _Run, cfg: SFTConfig, batch: list[tuple[np.ndarray, np.ndarray]],
                lr: float) -> tuple[torch.Tensor, dict[str, float], float, int]:
    """One optimizer step on `batch`: (loss, sft_loss's stats, grad norm, tokens in the padded batch)."""
    set_lr(r.optimizer, lr)
    ids, mask = collate(batch, r.pad)
    with autocast(r.device, cfg.dtype):
        loss, stats = sft_loss(r.model, ids, mask, cfg.mtp, [len(x) for x, _ in batch])
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(), cfg.optim.grad_clip or float("inf"))
    r.optimizer.step()
    r.optimizer.zero_grad(set_to_none=True)
    return loss, stats, float(grad_norm), int(ids.numel())


def _show_step(bar: Progress, job: int, cfg: SFTConfig, record: dict[str, Any], last_val: float | None) -> None:
    """The progress bar's loss, and a printed line every log.every_steps steps."""
    step = record["step"]
    bar.update(job, advance=1, info=f"loss {record['loss_main']:.3f}"
               + (f" val {last_val:.3f}" if last_val is not None else ""))
    if step % cfg.log.every_steps == 0 or step == cfg.steps:
        bar.console.print(f"step {step}/{cfg.steps} loss {record['loss_main']:.4f}"
                          + (f" mtp {record['loss_mtp']:.3f}" if "loss_mtp" in record else "")
                          + (f" val {record['val_loss']:.4f}" if "val_loss" in record else "")
                          + f" lr {record['lr']:.2e} epoch {record['epoch']}")


def _save(r: _Run, cfg: SFTConfig, step: int) -> None:
    """A resumable checkpoint: model, optimizer, the example cursor and the RNG state."""
    trainer_state = {"step": step, "epoch": r.order.epoch, "index": r.order.index,
                     "optimizer": r.optimizer.state_dict(), "rng": torch.get_rng_state(), "examples": len(r.data)}
    ckpt.save_checkpoint(r.run_dir, step, r.model, None, trainer_state, r.config_yaml, r.tok, cfg.checkpoint.keep_last)


def train_sft(cfg: SFTConfig, *, resume: bool = False, console: Console | None = None, backend=None,
              on_step: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
    """Run (or continue, with resume) the SFT run `cfg`; returns a summary with the model dir."""
    console = console or Console()
    r = _set_up(cfg, resume, console, backend)
    step, run_dir = r.step, r.run_dir
    metrics = MetricsWriter(run_dir, tensorboard=False, resume_step=step if r.resumed else None)
    last_val = evaluate(r.model, r.val, r.pad, cfg.batch_size) if r.val and step == 0 else None
    if last_val is not None:
        metrics.write(0, {"val_loss": last_val})
    console.print(f"[bold]sft[/] {run_dir}: {sum(p.numel() for p in r.model.parameters()) / 1e6:.1f}M parameters "
                  f"on {r.device}, "
                  f"{len(r.order.train_idx)} train / {len(r.val)} val examples, {cfg.steps} steps of {cfg.batch_size}"
                  + (f", resuming at step {step}" if step else "")
                  + (f"; val loss {last_val:.4f}" if last_val is not None else ""))
    t_start, saved = time.perf_counter(), step if r.resumed else -1
    threads = StepThreads() if r.device.type == "cpu" else None  # capped by the CPUs others leave free
    try:
        with Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=console) as bar:
            job = bar.add_task("sft", total=cfg.steps, completed=step, info="")
            while step < cfg.steps:
                batch = [r.data[i] for i in r.order.take(cfg.batch_size)]
                lr = lr_at(cfg.phase, step)
                if threads is not None:
                    threads.fit()
                t0 = time.perf_counter()
                loss, stats, grad_norm, tokens = _train_step(r, cfg, batch, lr)
                step += 1
                record = {"step": step, "loss": float(loss.detach()), **stats, "lr": lr, "grad_norm": grad_norm,
                          "epoch": r.order.epoch, "tokens": tokens, "step_s": time.perf_counter() - t0}
                if (step % cfg.eval_every == 0 or step == cfg.steps) and r.val:
                    last_val = record["val_loss"] = evaluate(r.model, r.val, r.pad, cfg.batch_size)
                metrics.write(step, record)
                _show_step(bar, job, cfg, record, last_val)
                if step % cfg.checkpoint.every_steps == 0 or step == cfg.steps:
                    _save(r, cfg, step)
                    saved = step
                if on_step is not None:
                    on_step(step, record)
        if saved == step:
            ckpt.publish_model(ckpt.latest_checkpoint(run_dir), run_dir / "model")
    finally:
        metrics.close()
    elapsed = time.perf_counter() - t_start
    console.print(f"[bold]done[/]: {step} steps in {elapsed:.0f} s; model in {run_dir / 'model'}")
    return {"run_dir": str(run_dir), "model_dir": str(run_dir / "model"), "steps": step, "train_s": elapsed,
            "val_loss": last_val, "data": r.data.meta}
