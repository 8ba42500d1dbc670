"""`make demo`: the whole pipeline on a laptop CPU, from a tokenizer to a model that RL improved.

Stages (each writes `<out_dir>/stages/<name>.json` when it finishes; a rerun skips finished
stages, and an interrupted pretraining, SFT, evaluation or RL stage resumes from its last
checkpoint or finished episode):

    1 tokenizer   byte-level BPE (small vocabulary) on stdlib code (model.tokenizer.code_corpus)
                  + demo-family sources drawn with a generator stream of their own + the demo
                  environment's system turn (the text every episode starts with)
    2 pretrain    a tiny MoE+MTP model (pretrain/train.py) on stdlib code, a couple of minutes
    3 tasks       the demo family (tasks/demo_family.py) from three generator seeds: SFT tasks,
                  RL tasks and held-out tasks, pairwise disjoint (each excludes the others' instances)
    4 sft         SFT (pretrain/sft.py) on the demonstrator's trajectories (demo_family.demonstrator:
                  ReadEditOracle, writing a plausible wrong fix on sft.decoy_rate of the tasks)
                  collected through the real agent loop in sandbox forks of the SFT tasks
    5 eval_sft    `opencomposer eval` of the SFT checkpoint on the held-out tasks (engine policy)
    6 rl          asynchronous agentic RL (rl/orchestrator.py run_agentic) on the RL tasks:
                  the real sandbox, tools, agent loop, grader and hidden tests
    7 eval_rl     the RL checkpoint on the same held-out tasks, with the same settings
    8 report      learning curve (PNG), before/after held-out success, the cost/accuracy plot
                  and trajectory viewer (eval/report.py), README.md / index.html summary

The tasks are small generated mini-projects with one templated one-line bug each, not
real-world tasks; the report says so. The environment is the demo's (DEMO_AGENT): read_file and
edit_file with compact schemas, a short system prompt, 4 turns, a 1,024-token context.
Evaluation before and after RL uses the same held-out suite, sampling temperature and agent
settings (`eval.temperature`, stated in the report).

Configuration: `PipelineConfig` holds every default (configs/demo/pipeline.yaml restates them);
`opencomposer demo --config FILE --set key.sub=value`.

GPUs and Ray: `run.device` (auto: a GPU when torch sees one, opencomposer/device.py) goes to every
stage that computes: pretraining, SFT, both evaluations' engine, and RL's trainer, reference
model and engine; without a GPU nothing changes. `rl.runner: ray` runs the RL stage on Ray
(rl/ray_runner.py: rollout actors, an inference actor, FSDP2 trainer ranks; `rl.ray` says where
and how many GPUs each actor gets); the other stages run in this process, on its node's GPU.
configs/demo/pipeline_1gpu.yaml and pipeline_ray_cluster.yaml size the pipeline for one GPU and
for a cluster; the project's tests validate them but cannot run them (no GPU on its machines).
Left out: several seeds in one run (benchmarks/demo_seeds.py runs the pipeline per seed),
multi-GPU pretraining or SFT inside the pipeline (torchrun configs/pretrain/gpu_small.yaml
instead), and evaluation spread over Ray.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Literal

import yaml
from pydantic import Field, model_validator
from rich.console import Console

from opencomposer.config import RunConfig, Section, variant
from opencomposer.config import load_config as _load
from opencomposer.device import resolve_device
from opencomposer.errors import ConfigError
from opencomposer.rl.config import RayRunnerConfig


class TokenizerStage(Section):
    """Stage 1: the byte-level BPE every later stage uses."""

    vocab_size: int = Field(2048, ge=272)
    """BPE vocabulary (special tokens included); small keeps the embedding and head cheap."""
    code_bytes: int = Field(4_000_000, gt=0)
    """Bytes of stdlib code to train on."""
    family_samples: int = Field(400, ge=0)
    """Demo-family modules drawn (generator stream "tokenizer", never the task seeds) for the corpus."""
    split_digits: bool = True
    """One digit per token (model.tokenizer.train_tokenizer): numbers are copied digit by digit, which
    the small model learns where multi-digit tokens left it unable to copy a constant (docs/demo-design.md)."""


DEFAULT_MODEL: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 384, "moe_intermediate_size": 192, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 1024, "num_mtp_modules": 1}
"""The demo's MoE+MTP decoder (ModelConfig keys; vocab_size comes from the tokenizer)."""


class PretrainStage(Section):
    """Stage 2: pretraining the MoE+MTP model on stdlib code (one phase, pretrain/train.py)."""

    model: dict[str, Any] = {}
    """ModelConfig keys that replace DEFAULT_MODEL's."""
    steps: int = Field(150, gt=0)
    """Optimizer steps (MTP is trained from the halfway step on)."""
    seq_len: int = Field(256, gt=1)
    """Tokens per training sequence."""
    batch_size: int = Field(8, gt=0)
    """Sequences per step."""
    lr: float = Field(3e-3, gt=0)
    """Peak learning rate (warm-up over a fifth of the steps, at most 20, then cosine)."""
    code_bytes: int = Field(4_000_000, gt=0)
    """Bytes of stdlib code to pretrain on."""


class TasksStage(Section):
    """Stage 3: the demo family's SFT, held-out and RL suites, from three generator seeds, pairwise disjoint."""

    n_train: int = Field(2048, gt=0)
    """SFT's tasks, one demonstration each: enough that SFT learns to copy paths, lines and numbers
    rather than memorise instances (docs/demo-design.md has the sizes measured)."""
    n_heldout: int = Field(200, gt=0)
    """Held-out tasks both evaluations run (never trained on by SFT or RL)."""
    n_rl: int = Field(1152, gt=0)
    """Tasks for RL, from a third generator seed with every training and held-out instance
    excluded: RL never trains on the tasks SFT memorised (nor on held-out ones)."""
    difficulty: int = Field(0, ge=0)
    """Distractor functions per module (demo_family.MAX_DIFFICULTY at most)."""
    two_file_rate: float = Field(0.0, ge=0, le=1)
    """Share of two-file tasks (two named bugs in two modules: reading both files in one turn saves
    a turn; demo_family.make_two_file_instance), the hard half of issue 21's easy/hard mix."""
    max_turns: int = Field(4, ge=2)
    """The demo environment's turn limit, in every stage (DEMO_AGENT: read, edit, answer, one spare);
    a two-file task read and edited one call a turn, then verified, takes 6."""


class SFTStage(Section):
    """Stage 4: SFT on the demonstrator's trajectories of the SFT tasks (pretrain/sft.py)."""

    steps: int = Field(1200, gt=0)
    """Optimizer steps (~4.7 epochs of 2,048 demonstrations): fewer leave the copying of paths and
    lines half learned and RL without a reward to climb (docs/demo-design.md)."""
    batch_size: int = Field(8, gt=0)
    """Demonstrations per step."""
    lr: float = Field(3e-3, gt=0)
    """Peak learning rate (cosine decay to a tenth)."""
    warmup_steps: int = Field(10, ge=0)
    """Linear learning-rate warm-up steps."""
    mtp_weight: float = Field(0.0, ge=0)
    """MTP self-distillation during SFT (0: off, which halves the step time; pretraining trains MTP)."""
    decoy_rate: float = Field(0.5, ge=0, le=1)
    """Share of SFT's demonstrations that write a plausible wrong fix (demo_family.demonstrator):
    an imperfect demonstrator, whose mistakes only the grader's reward, i.e. RL, can tell apart;
    with the oracle alone SFT leaves RL little to improve (docs/demo-design.md)."""
    parallel_rate: float = Field(1.0, ge=0, le=1)
    """Share of the demonstrations that batch their calls (the reads in one turn, the edits in one
    turn); the rest make one call a turn (demo_family.demonstrator's habits, issue 21)."""
    verify_rate: float = Field(0.0, ge=0, le=1)
    """Share of the demonstrations that read the edited file again before answering (a needless turn)."""
    parallel_choice_rate: float = Field(1.0, ge=0, le=1)
    """Share of the batching demonstrations whose first turn (the batched reads) SFT learns from; on
    the rest it learns to work from reads batched in one turn but not to choose them
    (demo_family.demonstrator): few batched reads after SFT, and those completed."""
    survey_rate: float = Field(0.0, ge=0, le=1)
    """Share of the demonstrations that first read the package's __init__.py in a turn of its own (a
    needless turn before the reads)."""
    habit_tasks: Literal["all", "one_file"] = "all"
    """Which tasks the re-read and the survey fall on: "all", or "one_file" (the easy tasks), which
    leaves a two-file task's unbatched calls as its only turns to save (demo_family.teacher_habits)."""


class EvalStage(Section):
    """Stages 5 and 7: the SFT and the RL checkpoint on the held-out tasks, with the same settings."""

    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of both evaluations (RL samples at rl.temperature)."""
    concurrency: int = Field(64, ge=1)
    """Episodes at once (one engine batches them)."""


class RLStage(Section):
    """Stage 6: asynchronous agentic RL on the RL tasks (the RL config it builds: Pipeline._rl)."""

    steps: int = Field(48, gt=0)
    """Trainer steps; steps x groups_per_step RL tasks are used, each once (docs/demo-design.md
    compares step counts)."""
    group_size: int = Field(8, ge=2)
    """G: rollouts per task (Dr. GRPO needs mixed outcomes within a group)."""
    groups_per_step: int = Field(16, ge=1)
    """B: tasks per step, 128 rollouts: fewer make a gradient that is mostly noise (docs/demo-design.md)."""
    lr: float = Field(2e-4, gt=0)
    """Peak learning rate (train.optim.lr)."""
    temperature: float = Field(1.0, gt=0)
    """Rollout sampling temperature; the trainer divides its logits by it too, so RL stays on-policy
    for the tempered policy (the evaluations use eval.temperature)."""
    kl_coef: float = Field(0.0, ge=0)
    """beta of the KL penalty to the SFT policy."""
    length_coef: float = Field(0.0, ge=0)
    """lambda of the length penalty. 0: among failed rollouts a penalty favours the shortest, i.e.
    answering at once without tools, a collapse (docs/demo-design.md)."""
    tool_error_coef: float = Field(0.0, ge=0)
    """Penalty per failed or malformed tool call (0 for the same reason: correctness is the signal)."""
    length_k: float = Field(1e-3, gt=0)
    """k of the length penalty C(x) = ((1+kx)^(1-q) - 1)/(k(1-q)) (rl.reward.length_k)."""
    length_q: float = Field(1.0, ge=0)
    """q of the length penalty: 0 linear, 1 logarithmic, > 0 concave (rl.reward.length_q)."""
    length_scope: Literal["all", "correct"] = "all"
    """rl.reward.length_scope: "correct" charges the length penalty to successes only, scaled by
    correctness and capped at it, so failures are not ranked by length (issue 21)."""
    zero_failed_groups: bool = False
    """rl.advantage.zero_failed_groups: groups with no success get advantage 0, so the length and
    tool-error penalties cannot rank failures (the quitting collapse, issue 21). No effect while
    the penalties are 0 (such groups then tie already)."""
    warmup_steps: int = Field(4, ge=0)
    """Linear learning-rate warm-up (RL's first Adam steps are otherwise sign-like)."""
    min_lr_ratio: float | None = Field(0.1, gt=0, le=1)
    """Cosine decay of the lr to lr x this over the RL steps (None: constant after the warm-up)."""
    frozen: list[str] = []
    """Parameter-name prefixes RL leaves fixed (train.frozen), e.g. embed_tokens and lm_head."""
    dynamic_sampling: bool = False
    """Groups whose rollouts all tie do not count toward groups_per_step (DAPO; orchestrator.py)."""
    rollout_workers: int = Field(8, ge=1)
    """Groups rolled out at once; the engine batches all their rollouts (group_size x this slots)."""
    max_staleness: int = Field(1, ge=0)
    """s: a group is trained at most s policy versions after its oldest token was sampled (agentic.max_staleness)."""
    micro_batch_size: int = Field(16, ge=1)
    """Sequences per trainer forward/backward (train.micro_batch_size)."""
    runner: Literal["local", "ray"] = "local"
    """local: trainer and engine in this process; ray: rollout, inference and trainer actors (rl/ray_runner.py)."""
    ray: RayRunnerConfig = RayRunnerConfig()
    """With runner ray: address (null: a local Ray instance), actors, trainer world size, GPUs per actor."""


class PipelineRunConfig(variant(RunConfig, "PipelineRunFields", out_dir="runs/demo", num_threads=1, describe={
        "out_dir": "The pipeline's directory: every stage's outputs, stages/*.json, pipeline.yaml, the report.",
        "seed": "Seeds the model, the SFT order, RL; the task seeds are derived from it.",
        "num_threads": "torch threads of the stages where the engine, the sandboxes' tests and (in RL) the trainer "
                       "compute at once (evaluations, local RL): one leaves the other core to them.",
        "device": "Where every stage computes: auto (a GPU if torch sees one), cpu, cuda; Ray's RL actors use "
                  "rl.ray's GPUs."})):
    """Where the demo writes, its seed, threads and device."""

    train_threads: int | None = Field(2, ge=1)
    """torch threads of pretraining and SFT, where nothing else computes (two beat one on an idle
    2-core machine; one beats two when other jobs share the cores: docs/demo-design.md)."""


RENAMED = {"out_dir": "run.out_dir", "seed": "run.seed", "threads": "run.num_threads",
           "train_threads": "run.train_threads", "device": "run.device"}
"""Keys of older pipeline configs and their replacements (a config holding one stops, naming it)."""


class PipelineConfig(Section):
    """The whole demo; every field has the `make demo` default."""

    run: PipelineRunConfig = PipelineRunConfig()
    """Directory, seed, threads and device of the whole pipeline."""
    tokenizer: TokenizerStage = TokenizerStage()
    """Stage 1."""
    pretrain: PretrainStage = PretrainStage()
    """Stage 2."""
    tasks: TasksStage = TasksStage()
    """Stage 3."""
    sft: SFTStage = SFTStage()
    """Stage 4."""
    eval: EvalStage = EvalStage()
    """Stages 5 and 7."""
    rl: RLStage = RLStage()
    """Stage 6."""

    @model_validator(mode="after")
    def _enough_tasks(self) -> "PipelineConfig":
        need = self.rl.steps * self.rl.groups_per_step
        if need > self.tasks.n_rl:  # RL visits each of its tasks at most once
            raise ValueError(f"rl.steps x rl.groups_per_step = {need} tasks, but tasks.n_rl is {self.tasks.n_rl}")
        # the demonstrator's longest episode: its call turns (one call a turn on two-file tasks
        # unless it always batches), a re-read if it ever verifies, a survey if it ever surveys
        # (not on two-file tasks when the habits keep to one-file ones), the answer
        t, s = self.tasks, self.sft
        habits = (s.verify_rate > 0) + (s.survey_rate > 0)
        calls = 4 if t.two_file_rate and s.parallel_rate < 1 else 2
        longest = max(calls, 2 + habits) + 1 if s.habit_tasks == "one_file" else calls + habits + 1
        if t.max_turns < longest:
            raise ValueError(f"tasks.max_turns is {t.max_turns}, but the demonstrator's episodes take up to {longest} "
                             f"turns (tasks.two_file_rate {t.two_file_rate}, sft.parallel_rate {s.parallel_rate}, "
                             f"sft.verify_rate {s.verify_rate}, sft.survey_rate {s.survey_rate}, sft.habit_tasks "
                             f"{s.habit_tasks}): raise "
                             "tasks.max_turns")
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Read a YAML file (or the defaults), apply `key.sub=value` overrides, validate."""
    return _load(PipelineConfig, path, overrides, renamed=RENAMED)


def demo_agent(temperature: float = 1.0, max_turns: int | None = None):
    from opencomposer.tasks.demo_family import DEMO_AGENT

    return DEMO_AGENT.model_copy(update={"temperature": temperature, "max_turns": max_turns or DEMO_AGENT.max_turns})


# ----------------------------------------------------------------------------- the stages

class Pipeline:
    """Runs the stages in order into cfg.out_dir; `paths` names every artifact."""

    def __init__(self, cfg: PipelineConfig, console: Console | None = None):
        self.cfg, self.console = cfg, console or Console()
        self.out = Path(cfg.run.out_dir).resolve()
        o = self.out
        self.paths = {"tokenizer": o / "tokenizer", "pretrain": o / "pretrain", "train_suite": o / "tasks" / "train",
                      "heldout_suite": o / "tasks" / "heldout", "rl_suite": o / "tasks" / "rl", "sft": o / "sft", "eval_sft": o / "eval" / "sft",
                      "rl": o / "rl", "eval_rl": o / "eval" / "rl", "report": o / "report", "cache": o / "cache"}

    def model_dict(self) -> dict[str, Any]:
        """The model's ModelConfig keys as this run sets them (vocab_size aside)."""
        return {**DEFAULT_MODEL, **self.cfg.pretrain.model}

    def stage_file(self, name: str) -> Path:
        return self.out / "stages" / f"{name}.json"

    def record(self, name: str) -> dict | None:
        f = self.stage_file(name)
        return json.loads(f.read_text()) if f.is_file() else None

    def run(self, until: str | None = None) -> Path:
        """Run every unfinished stage, or those up to and including `until` (one of STAGES);
        returns the report's index.html, or with `until` that stage's output directory."""
        import torch

        if until is not None and until not in self.STAGES:
            raise ConfigError(f"until={until!r} is not a stage; the stages are {', '.join(self.STAGES)}")
        stages = self.STAGES[:self.STAGES.index(until) + 1] if until else self.STAGES
        resolve_device(self.cfg.run.device, "run.device")  # device: cuda without a GPU stops here, before any stage
        self.out.mkdir(parents=True, exist_ok=True)
        saved, now = self.out / "pipeline.yaml", self.cfg.model_dump(mode="json")
        old = now
        if saved.is_file():  # validated, so a field added since then, at its default, is no difference
            old = PipelineConfig.model_validate(yaml.safe_load(saved.read_text())).model_dump(mode="json")
        if old != now:
            diff = {f"{k}": (old[k], now[k]) for k in now if old.get(k) != now[k]}
            raise ConfigError(f"{self.out} holds a pipeline run with another config (differences, then and now: "
                              f"{diff}); set run.out_dir to another directory, or delete {self.out} to start over")
        saved.write_text(yaml.safe_dump(now, sort_keys=False))
        for i, name in enumerate(stages, 1):
            done = self.record(name)
            if done is not None:
                self.console.print(f"[dim]stage {i}/{len(self.STAGES)} {name}: done earlier "
                                   f"({done['wall_s']:.0f} s), skipped[/]")
                continue
            self.console.rule(f"[bold]stage {i}/{len(self.STAGES)}: {name}")
            stage, trains = self.STAGE_TABLE[name]
            threads = self.cfg.run.train_threads if trains else self.cfg.run.num_threads
            if threads:
                torch.set_num_threads(threads)
            t0 = time.perf_counter()
            figures = stage(self)
            if torch.cuda.is_available():  # later stages may run in other processes (Ray actors) on this GPU
                torch.cuda.empty_cache()
            rec = {"stage": name, "wall_s": time.perf_counter() - t0, **figures}
            self.stage_file(name).parent.mkdir(parents=True, exist_ok=True)
            self.stage_file(name).write_text(json.dumps(rec, indent=2))
            self.console.print(f"[green]{name} done[/] in {rec['wall_s']:.0f} s")
        if until is not None and until != "report":
            where = self.paths.get(until, self.out / until)
            self.console.print(f"stopped after stage {until} (--until); its output: [bold]{where}[/]; "
                               f"run again without --until to go on")
            return where
        index = self.paths["report"] / "index.html"
        summary = json.loads((self.paths["report"] / "summary_demo.json").read_text())
        self.console.rule("[bold]opencomposer demo: done")
        self.console.print(f"held-out success: SFT {summary['sft_success']:.1%} -> RL {summary['rl_success']:.1%} "
                           f"({summary['lift_points']:+.1f} points) on {summary['heldout_tasks']} tasks never trained on")
        self.console.print(f"report: [bold]{index}[/] (and {self.paths['report'] / 'README.md'})")
        return index

    # 1
    def _tokenizer(self) -> dict:
        from opencomposer.model.chat import render_tools
        from opencomposer.harness.tools import TOOLS
        from opencomposer.model.tokenizer import code_corpus, train_tokenizer
        from opencomposer.tasks.demo_family import make_instance

        c = self.cfg.tokenizer
        agent = demo_agent()
        system = agent.system_prompt + "\n\n" + render_tools([TOOLS[n].schema(agent.compact_tools) for n in agent.tools])
        rng = random.Random(f"tokenizer/{self.cfg.run.seed}")  # not a task seed: no held-out text

        def texts():
            yield from code_corpus(max_total_bytes=c.code_bytes)
            for _ in range(c.family_samples):
                inst = make_instance(rng, rng.randint(0, 1))
                yield inst.broken[inst.module_path] + "\n" + inst.instruction
                yield system

        tok = train_tokenizer(texts(), vocab_size=c.vocab_size, out_path=self.paths["tokenizer"], split_digits=c.split_digits)
        n_system = len(tok.encode(system))
        self.console.print(f"tokenizer: {tok.vocab_size} tokens; the demo's system turn is {n_system} tokens")
        return {"vocab_size": tok.vocab_size, "system_turn_tokens": n_system}

    # 2
    def _pretrain(self) -> dict:
        from opencomposer.pretrain.config import parse_config
        from opencomposer.pretrain.train import train

        c = self.cfg.pretrain
        from opencomposer.model.tokenizer import load_tokenizer

        vocab = load_tokenizer(self.paths["tokenizer"]).vocab_size
        cfg = parse_config({
            "run": {"out_dir": str(self.paths["pretrain"]), "seed": self.cfg.run.seed,
                    "num_threads": self.cfg.run.train_threads, "device": self.cfg.run.device},
            "model": {**self.model_dict(), "vocab_size": vocab},
            "data": {"sources": ["stdlib"], "max_total_bytes": c.code_bytes, "val_fraction": 0.05, "tokenizer": str(self.paths["tokenizer"]),
                     "cache_dir": str(self.paths["cache"] / "pretrain")},
            "phases": [{"name": "main", "steps": c.steps, "seq_len": c.seq_len, "batch_size": c.batch_size,
                        "lr": c.lr, "warmup_steps": min(20, c.steps // 5)}],
            "mtp": {"mode": "distill", "weight": 0.3, "start_step": c.steps // 2},
            "checkpoint": {"every_steps": max(1, c.steps // 3)}, "eval_every": c.steps, "eval_sequences": 8,
            "log": {"every_steps": max(1, c.steps // 10), "tensorboard": False}})
        out = train(cfg, resume=True, console=self.console)
        return {k: v for k, v in out.items() if isinstance(v, (int, float, str))}

    # 3
    def _tasks(self) -> dict:
        from opencomposer.tasks.demo_family import generate_tasks

        c = self.cfg.tasks
        train = generate_tasks(c.n_train, 2 * self.cfg.run.seed, self.paths["train_suite"], difficulty=c.difficulty,
                               suite_name="demo-train", two_file_rate=c.two_file_rate)
        held = generate_tasks(c.n_heldout, 2 * self.cfg.run.seed + 1, self.paths["heldout_suite"], difficulty=c.difficulty,
                              exclude={p.name for p in train}, suite_name="demo-heldout",
                              two_file_rate=c.two_file_rate)
        rl = generate_tasks(c.n_rl, 2 * self.cfg.run.seed + 1000, self.paths["rl_suite"], difficulty=c.difficulty,
                            exclude={p.name for p in train} | {p.name for p in held}, suite_name="demo-rl",
                            two_file_rate=c.two_file_rate)
        names = {k: {p.name for p in v} for k, v in (("SFT", train), ("held-out", held), ("RL", rl))}
        for a, b in (("held-out", "SFT"), ("held-out", "RL"), ("RL", "SFT")):
            overlap = names[a] & names[b]
            if overlap:  # generate_tasks excludes them; checked again because the claim is the demo's point
                raise ConfigError(f"{a} tasks overlap the {b} tasks: {sorted(overlap)[:3]}")
        self.console.print(f"{len(train)} SFT tasks, {len(rl)} RL tasks, {len(held)} held-out tasks "
                           f"(difficulty {c.difficulty}), pairwise disjoint")
        return {"train_tasks": len(train), "rl_tasks": len(rl), "heldout_tasks": len(held), "difficulty": c.difficulty}

    # 4
    def _sft(self) -> dict:
        from opencomposer.pretrain.sft import load_config as sft_config
        from opencomposer.pretrain.sft import train_sft

        c = self.cfg.sft
        cfg = sft_config(None, data={
            "run": {"out_dir": str(self.paths["sft"]), "seed": self.cfg.run.seed,
                    "num_threads": self.cfg.run.train_threads, "device": self.cfg.run.device},
            "init_from": str(self.paths["pretrain"] / "model"), "tokenizer": str(self.paths["tokenizer"]),
            "data": {"suite": str(self.paths["train_suite"]),
                     "agent": demo_agent(max_turns=self.cfg.tasks.max_turns).model_dump(mode="json"),
                     "concurrency": 2, "max_len": 1024, "val_examples": 16, "decoy_rate": c.decoy_rate,
                     "parallel_rate": c.parallel_rate, "verify_rate": c.verify_rate,
                     "parallel_choice_rate": c.parallel_choice_rate, "survey_rate": c.survey_rate,
                     "habit_tasks": c.habit_tasks,
                     "cache_dir": str(self.paths["cache"] / "sft")},
            "steps": c.steps, "batch_size": c.batch_size, "optim": {"lr": c.lr, "warmup_steps": c.warmup_steps},
            "mtp": {"mode": "distill", "weight": c.mtp_weight} if c.mtp_weight else None,
            "checkpoint": {"every_steps": max(1, c.steps // 4)}, "eval_every": max(1, c.steps // 4),
            "log": {"every_steps": max(1, c.steps // 10)}})
        out = train_sft(cfg, resume=True, console=self.console)
        return {"steps": out["steps"], "val_loss": out["val_loss"], "train_s": out["train_s"], **out["data"]}

    def _evaluate(self, model_dir: Path, out: Path, label: str) -> dict:
        import asyncio

        from opencomposer.eval.run import EvalOptions, evaluate

        e = self.cfg.eval
        options = EvalOptions(suite=str(self.paths["heldout_suite"]), policy=f"engine:{model_dir}", label=label,
                              concurrency=e.concurrency, task_timeout_s=300, tokenizer=str(self.paths["tokenizer"]),
                              agent=demo_agent(e.temperature, self.cfg.tasks.max_turns), device=self.cfg.run.device)
        s = asyncio.run(evaluate(options, out))["summary"]
        self.console.print(f"{label}: {s['accuracy']:.1%} of {s['episodes']} held-out episodes resolved "
                           f"(temperature {e.temperature})")
        return {"accuracy": s["accuracy"], "episodes": s["episodes"], "errors": s["errors"],
                "stop_reasons": s["stop_reasons"], "temperature": e.temperature}

    # 5
    def _eval_sft(self) -> dict:
        return self._evaluate(self.paths["sft"] / "model", self.paths["eval_sft"], "SFT checkpoint")

    # 6
    def _rl(self) -> dict:
        from opencomposer.rl.launch import run_rl
        from opencomposer.rl.config import AGENT_FROM_RUN, load_rl_config

        r = self.cfg.rl
        agent = demo_agent(max_turns=self.cfg.tasks.max_turns).model_dump(mode="json")
        # the RL run samples with its sampling section in engine.max_len: the agent's own fields go
        sampling = {"temperature": r.temperature, "max_new_tokens": agent["max_new_tokens"]}
        context_window = agent["context_window"]
        agent = {k: v for k, v in agent.items() if k not in AGENT_FROM_RUN}
        run = {"out_dir": str(self.paths["rl"]), "seed": self.cfg.run.seed}
        if r.runner == "local":  # Ray's actors choose their own devices and threads
            run.update(num_threads=self.cfg.run.num_threads, device=self.cfg.run.device)
        cfg = load_rl_config(data={
            "mode": "agentic",
            "run": run,
            "model": {"path": str(self.paths["sft"] / "model"), "tokenizer": str(self.paths["tokenizer"])},
            "engine": {"max_slots": max(16, r.group_size * r.rollout_workers), "max_len": context_window},
            "sampling": sampling,
            "train": {"max_steps": r.steps, "micro_batch_size": r.micro_batch_size, "frozen": r.frozen,
                      "optim": {"lr": r.lr, "warmup_steps": r.warmup_steps, "min_lr_ratio": r.min_lr_ratio}},
            "reward": {"kl_coef": r.kl_coef, "length_coef": r.length_coef, "failed_tool_call_coef": r.tool_error_coef,
                       "malformed_tool_call_coef": r.tool_error_coef, "length_k": r.length_k, "length_q": r.length_q,
                       "length_scope": r.length_scope},
            **({"advantage": {"zero_failed_groups": True}} if r.zero_failed_groups else {}),
            "checkpoint": {"every_steps": max(1, r.steps // 4), "keep_last": 2},
            "log": {"tensorboard": False},
            "agentic": {"suite": str(self.paths["rl_suite"]), "runner": r.runner,
                        **({"ray": r.ray.model_dump()} if r.runner == "ray" else {}),
                        "rollout": {"group_size": r.group_size, "min_group_size": 2, "task_timeout_s": 300,
                                    "agent": agent},
                        "groups_per_step": r.groups_per_step, "rollout_workers": r.rollout_workers,
                        "dynamic_sampling": r.dynamic_sampling,
                        "max_staleness": r.max_staleness}})
        out = run_rl(cfg, resume=True)
        return {"steps": out["steps"], "policy_version": out["policy_version"], "trained_tasks": len(out["trained"]),
                "given_up": len(out["given_up"]), "train_s": out["seconds"]}

    def rl_model_dir(self) -> Path:
        from opencomposer.rl.checkpoint import Checkpointer

        latest = Checkpointer(self.paths["rl"] / "checkpoints").latest()
        if latest is None:
            raise ConfigError(f"no RL checkpoint in {self.paths['rl']}: run the rl stage first")
        return latest / "model"

    # 7
    def _eval_rl(self) -> dict:
        return self._evaluate(self.rl_model_dir(), self.paths["eval_rl"], "RL checkpoint")

    # 8
    def _report(self) -> dict:
        from opencomposer.pipeline_report import write_demo_report

        return write_demo_report(self)

    # name -> (the stage, whether it trains: pretraining and SFT run at run.train_threads, the
    # rest at run.num_threads), in the order the stages run
    STAGE_TABLE: dict[str, tuple[Callable[["Pipeline"], dict], bool]] = {
        "tokenizer": (_tokenizer, False), "pretrain": (_pretrain, True), "tasks": (_tasks, False),
        "sft": (_sft, True), "eval_sft": (_eval_sft, False), "rl": (_rl, False), "eval_rl": (_eval_rl, False),
        "report": (_report, False),
    }
    STAGES = list(STAGE_TABLE)


def main(config: str | None = None, overrides: list[str] | tuple[str, ...] = (),
         console: Console | None = None, until: str | None = None) -> Path:
    """`make demo`: run the pipeline (configs/demo/pipeline.yaml or the defaults), or its stages
    up to `until`."""
    return Pipeline(load_config(config, overrides), console).run(until)


if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else None)
