"""Continued pretraining with MTP and context extension: `train(config)`.

The objective per step (mean over the packed tokens of the global batch):

    L = CE(main head)  +  (lambda / D) * sum_{k=1..D} L_k                (DeepSeek-V3 2412.19437 §2.2)

with L_k the cross-entropy of MTP depth k on token t_{i+k+1} ("ce"), or the KL from the main
head's detached distribution at the same target to depth k's ("distill", Composer 2 §3: MTP
layers initialised from scratch and trained by self-distillation from a mid-pretraining
checkpoint on, `mtp.start_step`). The loss code is mtp.py's `mtp_loss`; with
`detach_trunk` the MTP modules read the trunk's hidden states through `.detach()`.

Optimisation: AdamW (decay on matrices only), per-phase linear warmup then cosine decay to
`min_lr_ratio * lr`, global-norm gradient clipping, gradient accumulation over micro-batches.
Phases run in order with one optimiser; a phase with `yarn_factor = s` switches RoPE to YaRN
(Peng et al. 2309.00071) over the original length L0, max_position_embeddings = s * L0 (the
report's 32k -> 256k extension, at any scale). The RoPE of every step is a function of the
step alone, so a resumed run rebuilds it.

Checkpoints (checkpoint.py) hold the model in HF format, the optimizer, the data cursor, the
RNG states and the step; `resume=True` continues from the newest one and truncates
metrics.jsonl to its step, so the resumed curve is the uninterrupted one (bitwise on CPU
with `deterministic: true`; tests/pretrain/test_resume.py).

Distributed: under torchrun each rank takes its slice of every global batch (data.py's
`Batches`), the loss module is wrapped in DistributedDataParallel or sharded with FSDP2
(model/parallelize.py: per decoder block, per MTP module and at the root), and metrics are averaged
over ranks. The same global batch gives the same loss at any world size, up to float
summation order. Left out: tensor/expert/pipeline parallelism, activation checkpointing,
torch.compile, and fused CE kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from rich.console import Console
from torch import nn

from opencomposer.config import dump_config
from opencomposer.device import DeviceName, resolve_device
from opencomposer.device import autocast as compute_autocast
from opencomposer.errors import ConfigError
from opencomposer.model import ModelConfig, Transformer, load_pretrained
from opencomposer.model.model import rope_frequencies
from opencomposer.model.mtp import mtp_loss
from opencomposer.model.parallelize import apply_ddp, apply_fsdp
from opencomposer.model.export import check_tokenizer
from opencomposer.model.tokenizer import Tokenizer, load_tokenizer
from opencomposer.pretrain import checkpoint as ckpt
from opencomposer.pretrain.config import MTPConfig, PhaseConfig, PretrainConfig
from opencomposer.pretrain.data import Batches, PackedSequences, TokenCorpus, eval_sequences
from opencomposer.training.allocator import keep_freed_memory
from opencomposer.training.metrics import MetricsWriter
from opencomposer.training.schedule import warmup_cosine_lr

STATS = ("loss_main", "loss_mtp", "mtp_agree")  # what PretrainLoss reports besides the loss


class PretrainLoss(nn.Module):
    """The training objective around a Transformer; the module DDP/FSDP wrap, so that the MTP
    modules run inside the wrapped forward.

    forward(ids [B, L+1], use_mtp) -> (loss, stats [3]): inputs ids[:, :L], targets ids[:, 1:].
    stats = main CE, the mean over depths of L_k (unweighted), and the fraction of positions
    where depth 1's argmax equals the main head's argmax for the same token (the acceptance
    rate of greedy one-token speculative decoding).
    """

    def __init__(self, model: Transformer, mtp: MTPConfig):
        super().__init__()
        self.model, self.mode, self.weight, self.detach = model, mtp.mode, mtp.weight, mtp.detach

    def forward(self, ids_BL1: torch.Tensor, use_mtp: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x_BL, y_BL = ids_BL1[:, :-1], ids_BL1[:, 1:]
        out = self.model(x_BL)
        main = F.cross_entropy(out.logits.flatten(0, 1).float(), y_BL.flatten())
        mtp_weighted = mtp_mean = agree = main.new_zeros(())
        if use_mtp and len(self.model.mtp) and x_BL.shape[1] > 2:
            hidden = out.hidden.detach() if self.detach else out.hidden
            logits = self.model.mtp_logits(x_BL, hidden)
            mtp_weighted, per_depth = mtp_loss(logits, x_BL, mode=self.mode, main_logits=out.logits,
                                               weight=self.weight)
            mtp_mean = torch.stack(per_depth).mean()
            L = x_BL.shape[1]  # depth 1 at position i and the main head at i + 1 both predict t_{i+2}
            agree = (logits[0].argmax(-1) == out.logits[:, 1:L - 1].argmax(-1)).float().mean()
        stats = torch.stack([main.detach(), mtp_mean.detach(), agree.detach()])
        return main + mtp_weighted, stats


# ---- distributed setup ----------------------------------------------------------------------

@dataclass
class DistInfo:
    rank: int
    world: int
    device: torch.device
    owns_group: bool  # we initialised the process group, so we destroy it

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init_distributed(device_name: DeviceName = "auto") -> DistInfo:
    """Join the torchrun process group when WORLD_SIZE > 1 (nccl on GPUs, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = resolve_device(device_name).type == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
        owns = True
    rank = dist.get_rank() if world > 1 else 0
    return DistInfo(rank, world, device, owns)


def wrap(loss_module: PretrainLoss, cfg: PretrainConfig, d: DistInfo) -> nn.Module:
    """The module the loop calls: the loss itself, DDP around it, or it sharded by FSDP2."""
    if d.world == 1:
        return loss_module
    model = loss_module.model
    if cfg.parallel == "ddp":
        # MTP parameters get no gradient before mtp.start_step: DDP must be told to look for them.
        return apply_ddp(loss_module, d.device, find_unused_parameters=len(model.mtp) > 0 and cfg.mtp.start_step > 0)
    from torch.distributed.device_mesh import init_device_mesh

    # the loss module is the root, so the MTP modules run inside the sharded forward
    return apply_fsdp(model, root=loss_module, mesh=init_device_mesh(d.device.type, (d.world,)))


def _sync(runner: nn.Module, last: bool, sharded: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on all but the last micro-batch of a step."""
    if sharded:
        runner.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if hasattr(runner, "no_sync") and not last:
        return runner.no_sync()
    return contextlib.nullcontext()


# ---- schedule, context, optimiser ------------------------------------------------------------

def lr_at(phase: PhaseConfig, step: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio at the last step."""
    return warmup_cosine_lr(phase.lr, step, phase.warmup_steps, phase.steps, phase.min_lr_ratio)


def extended_config(base: ModelConfig, yarn_factor: float | None) -> ModelConfig:
    """The model config of a phase: `base` itself, or YaRN with factor s over base's original length."""
    if yarn_factor is None:
        return base
    original = (base.rope_scaling or {}).get("original_max_position_embeddings", base.max_position_embeddings)
    return dataclasses.replace(
        base, max_position_embeddings=int(round(original * yarn_factor)),
        rope_scaling={"rope_type": "yarn", "factor": float(yarn_factor), "original_max_position_embeddings": original})


def set_context(model: Transformer, config: ModelConfig) -> None:
    """Switch the model's RoPE (frequencies and YaRN attention scale) to `config`'s; no weights change."""
    model.config = config
    model.inv_freq, model.rope_scale = rope_frequencies(config)


def make_optimizer(module: nn.Module, cfg: PretrainConfig) -> torch.optim.AdamW:
    """AdamW, decay on matrices only. fused=True: the update as one vectorised pass per tensor; on
    the CPU torch's default is a loop of ~10 elementwise ops per tensor (31 against 7 ms a step for
    vs_trl.py's 12.6M parameters, 5.4 against 2.2 ms for the demo's 3.1M, 2 threads), and the
    update is the same up to float rounding (~1e-8)."""
    decay = [p for p in module.parameters() if p.ndim >= 2]
    other = [p for p in module.parameters() if p.ndim < 2]
    o = cfg.optim
    return torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=cfg.phases[0].lr, betas=o.betas, eps=o.eps, fused=True)


# ---- evaluation ----------------------------------------------------------------------------

@torch.no_grad()
def evaluate(runner: nn.Module, tokens: np.ndarray, seq_len: int, n: int, micro: int, use_mtp: bool,
             d: DistInfo | None = None, autocast: contextlib.AbstractContextManager | None = None) -> dict[str, float]:
    """Mean main loss, MTP loss and MTP agreement on the first n held-out sequences of seq_len
    (split over ranks; every rank runs the same number of forwards, as FSDP requires)."""
    rank, world = (d.rank, d.world) if d else (0, 1)
    per_rank = max(n // world, 1)
    seqs = eval_sequences(tokens, seq_len, per_rank * world)[rank * per_rank:(rank + 1) * per_rank]
    device = next(runner.parameters()).device
    total = torch.zeros(len(STATS), device=device)
    for i in range(0, per_rank, micro):
        with autocast or contextlib.nullcontext():
            _, stats = runner(torch.from_numpy(seqs[i:i + micro]).to(device), use_mtp)
        total += stats.float() * len(seqs[i:i + micro])
    if world > 1:
        dist.all_reduce(total)
    total /= per_rank * world
    return {f"eval_{k}": float(v) for k, v in zip(STATS, total.tolist())}


# ---- run set-up (pretraining and SFT) ------------------------------------------------------

def use_deterministic_algorithms() -> None:
    """Deterministic kernels, so that a resumed run repeats the uninterrupted one."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs
    torch.use_deterministic_algorithms(True, warn_only=True)
    # The mode also fills every new tensor with NaN (a debugging aid against reads of uninitialised
    # memory): ~2,000 fills per SFT step, which no correct kernel reads. The kernels stay deterministic.
    torch.utils.deterministic.fill_uninitialized_memory = False


def open_run_dir(run_dir: Path, resume: bool, config_yaml: str, write: bool = True) -> Path | None:
    """The newest checkpoint in run_dir (None: a fresh run), after creating run_dir and writing the
    resolved config there (`write`: the rank that writes). Without `resume`, a run_dir that holds
    checkpoints is refused rather than overwritten."""
    found = ckpt.latest_checkpoint(run_dir)
    if found is not None and not resume:
        raise ConfigError(f"{run_dir} already holds checkpoints (newest: {found.name}); pass --resume to "
                          f"continue that run, or choose another run.out_dir")
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config_yaml)
    return found


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# ---- the loop ------------------------------------------------------------------------------

@dataclass
class _Run:
    """What the loop works on (`_set_up`)."""

    cfg: PretrainConfig
    d: DistInfo
    run_dir: Path
    tok: Tokenizer
    corpus: TokenCorpus
    model: Transformer
    base: ModelConfig
    """The model config before any phase's context extension (what checkpoints keep)."""
    loss_module: PretrainLoss
    runner: nn.Module
    """What the loop calls: loss_module, or it wrapped for DDP/FSDP (`wrap`)."""
    sharded: bool
    optimizer: torch.optim.AdamW
    autocast: contextlib.AbstractContextManager
    state: dict[str, Any]
    """The trainer state of the checkpoint resumed from ({} for a fresh run)."""
    resumed: bool


def _fresh_model(cfg: PretrainConfig) -> Transformer:
    if cfg.init_from:
        return load_pretrained(cfg.init_from, dtype=torch.float32)
    torch.manual_seed(cfg.run.seed)
    return Transformer(ModelConfig.from_dict(cfg.model_dict()))


def _load_corpus(cfg: PretrainConfig, tok: Tokenizer, d: DistInfo) -> TokenCorpus:
    if d.main:  # one rank tokenizes; the others then find the cache
        corpus = TokenCorpus.build(cfg.data, tok)
    d.barrier()
    if not d.main:
        corpus = TokenCorpus.build(cfg.data, tok)
    return corpus


def _load_model(cfg: PretrainConfig, found: Path | None, d: DistInfo) -> tuple[Transformer, ModelConfig, dict]:
    """(model, its base config, trainer state): from the checkpoint `found`, with its RNG states
    restored, or fresh."""
    if found is None:
        model = _fresh_model(cfg)
        return model, model.config, {}
    state = ckpt.load_trainer_state(found)
    model = load_pretrained(found / "model", dtype=torch.float32)
    torch.set_rng_state(state["rng"])
    if d.device.type == "cuda" and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"])
    return model, ModelConfig.from_dict(state["base_model_config"]), state


def _set_up(cfg: PretrainConfig, resume: bool, d: DistInfo) -> _Run:
    """Threads, determinism, the run directory, data, model, wrapper and optimizer (resumed from the
    newest checkpoint when there is one)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(d.world)))
    torch.set_num_threads(cfg.run.num_threads or max(1, torch.get_num_threads() // local_world))
    keep_freed_memory()
    if cfg.deterministic:
        use_deterministic_algorithms()
    run_dir = Path(cfg.run.out_dir)
    found = open_run_dir(run_dir, resume, dump_config(cfg), write=d.main)
    tok = load_tokenizer(cfg.data.tokenizer)
    corpus = _load_corpus(cfg, tok, d)
    model, base, state = _load_model(cfg, found, d)
    if tok.vocab_size > model.config.vocab_size:
        raise ConfigError(f"the tokenizer has {tok.vocab_size} tokens but the model's vocab_size is "
                          f"{model.config.vocab_size}; use a matching data.tokenizer or model")
    check_tokenizer(tok, model.config, cfg.data.tokenizer)  # the chat format's tokens (SFT and RL render chats)
    model.to(d.device).train()
    loss_module = PretrainLoss(model, cfg.mtp)
    runner = wrap(loss_module, cfg, d)
    sharded = d.world > 1 and cfg.parallel == "fsdp"
    optimizer = make_optimizer(loss_module, cfg)
    if state:
        ckpt.load_optimizer_state(runner, optimizer, state["optimizer"], sharded)
    autocast = compute_autocast(d.device, cfg.dtype)
    return _Run(cfg, d, run_dir, tok, corpus, model, base, loss_module, runner, sharded, optimizer, autocast, state,
                resumed=found is not None)


def _enter_phase(r: _Run, p: int) -> tuple[Batches, int, int]:
    """(batches, micro-batch size, micro-batches per step) of phase p, with its RoPE set on the model."""
    phase = r.cfg.phases[p]
    micro, accum = phase.accumulation(r.d.world)
    set_context(r.model, extended_config(r.base, phase.yarn_factor))
    batches = Batches(PackedSequences(r.corpus.train, phase.seq_len), phase.batch_size, micro,
                      r.cfg.run.seed, rank=r.d.rank, world_size=r.d.world, stream=p)
    if r.state.get("phase") == p:  # resuming inside this phase: continue its data order
        batches.load_state_dict(r.state["batches"])
    return batches, micro, accum


def _train_step(r: _Run, micro_batches: list[np.ndarray], accum: int, lr: float,
                use_mtp: bool) -> tuple[dict[str, float], float]:
    """One optimizer step over the micro-batches of a global batch; (STATS averaged over ranks, grad norm)."""
    set_lr(r.optimizer, lr)
    stats = torch.zeros(len(STATS), device=r.d.device)
    for i, mb in enumerate(micro_batches):
        with _sync(r.runner, i == accum - 1, r.sharded):
            with r.autocast:
                loss, s = r.runner(torch.from_numpy(mb).to(r.d.device), use_mtp)
            (loss / accum).backward()
        stats += s.float() / accum
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [q for q in r.loss_module.parameters() if q.grad is not None], r.cfg.optim.grad_clip or float("inf"))
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    r.optimizer.step()
    r.optimizer.zero_grad(set_to_none=True)
    if r.d.world > 1:
        dist.all_reduce(stats)
        stats /= r.d.world
    return dict(zip(STATS, stats.tolist())), float(grad_norm)


class _TokenRate:
    """Tokens per second since the previous call."""

    def __init__(self, tokens: int):
        self.t, self.tokens = time.perf_counter(), tokens

    def __call__(self, tokens: int) -> float:
        now = time.perf_counter()
        rate = (tokens - self.tokens) / max(now - self.t, 1e-9)
        self.t, self.tokens = now, tokens
        return rate


def _print_start(r: _Run, step: int, console: Console) -> None:
    n_params = sum(p.numel() for p in r.model.parameters())
    console.print(f"[bold]pretrain[/] {r.run_dir}: {n_params / 1e6:.1f}M parameters, "
                  f"{r.corpus.meta['train_tokens']:,} train / {r.corpus.meta['val_tokens']:,} held-out tokens, "
                  f"world size {r.d.world}" + (f", resuming at step {step}" if step else ""))


def _log_step(r: _Run, record: dict[str, Any], metrics: MetricsWriter | None, console: Console) -> None:
    if metrics is not None:
        metrics.write(record["step"], record)
    step, cfg = record["step"], r.cfg
    if r.d.main and (step % cfg.log.every_steps == 0 or step == cfg.total_steps):
        mtp_part = f" mtp {record['loss_mtp']:.3f} agree {record['mtp_agree']:.2f}" if record["mtp_on"] else ""
        console.print(f"step {step}/{cfg.total_steps} ({record['phase']}) loss {record['loss_main']:.4f}"
                      f"{mtp_part} lr {record['lr']:.2e} {record['tokens_per_s']:,.0f} tok/s")


def _evaluate_and_log(r: _Run, step: int, phase: PhaseConfig, micro: int, use_mtp: bool,
                      metrics: MetricsWriter | None, console: Console) -> dict[str, float]:
    """The held-out losses at the phase's sequence length, written and printed."""
    result = evaluate(r.runner, r.corpus.val, phase.seq_len, r.cfg.eval_sequences, micro, use_mtp, r.d, r.autocast)
    if metrics is not None:
        metrics.write(step, {"phase": phase.name, "seq_len": phase.seq_len, **result})
    if r.d.main:
        console.print(f"  eval @ {step}: loss {result['eval_loss_main']:.4f}"
                      + (f" mtp {result['eval_loss_mtp']:.3f}" if use_mtp else ""))
    return result


def _save(r: _Run, step: int, p: int, batches: Batches, tokens_seen: int) -> None:
    """A resumable checkpoint (every rank takes part in gathering the state; rank 0 writes it)."""
    gathered, opt_state = ckpt.full_state(r.runner, r.optimizer, r.sharded)
    if r.d.main:
        trainer_state = {
            "step": step, "phase": p, "batches": batches.state_dict(), "tokens": tokens_seen,
            "optimizer": opt_state, "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if r.d.device.type == "cuda" else None,
            "base_model_config": r.base.to_dict(), "world_size": r.d.world}
        ckpt.save_checkpoint(r.run_dir, step, r.model, gathered, trainer_state, dump_config(r.cfg), r.tok,
                             r.cfg.checkpoint.keep_last)
    r.d.barrier()


def train(cfg: PretrainConfig, *, resume: bool = False,
          on_step: Callable[[int, dict[str, Any]], None] | None = None,
          console: Console | None = None) -> dict[str, Any]:
    """Run (or, with resume, continue) the pretraining run `cfg` describes; returns a summary.

    on_step(step, record) is called on every rank after each optimizer step has been logged,
    evaluated and checkpointed (step counts from 1).
    """
    d = init_distributed(cfg.run.device)
    console = console or Console()
    r = _set_up(cfg, resume, d)
    step, tokens_seen = int(r.state.get("step", 0)), int(r.state.get("tokens", 0))
    # rank 0 writes the metrics; the record of a step is the same on every rank
    metrics = MetricsWriter(r.run_dir, tensorboard=cfg.log.tensorboard, resume_step=step if r.resumed else None) \
        if d.main else None
    if d.main:
        _print_start(r, step, console)
    phase_idx, last_eval = -1, {}
    saved_step = step if r.resumed else -1
    rate = _TokenRate(tokens_seen)
    try:
        while step < cfg.total_steps:
            p, pstep = cfg.locate(step)
            phase = cfg.phases[p]
            if p != phase_idx:
                (batches, micro, accum), phase_idx = _enter_phase(r, p), p
            lr = lr_at(phase, pstep)
            use_mtp = len(r.model.mtp) > 0 and step >= cfg.mtp.start_step
            values, grad_norm = _train_step(r, batches.next(), accum, lr, use_mtp)
            step += 1
            tokens_seen += phase.batch_size * phase.seq_len
            record = {"step": step, "phase": phase.name,
                      "loss": values["loss_main"] + cfg.mtp.weight * values["loss_mtp"], **values, "lr": lr,
                      "grad_norm": grad_norm, "tokens": tokens_seen, "tokens_per_s": rate(tokens_seen),
                      "mtp_on": use_mtp}
            _log_step(r, record, metrics, console)
            if step % cfg.eval_every == 0 or pstep + 1 == phase.steps:
                last_eval = _evaluate_and_log(r, step, phase, micro, use_mtp, metrics, console)
            if step % cfg.checkpoint.every_steps == 0 or step == cfg.total_steps:
                _save(r, step, p, batches, tokens_seen)
                saved_step = step
            if on_step is not None:
                on_step(step, record)
        if d.main and saved_step == step:
            ckpt.publish_model(ckpt.latest_checkpoint(r.run_dir), r.run_dir / "model")
            console.print(f"[bold]done[/]: final model in {r.run_dir / 'model'}")
    finally:
        if metrics is not None:
            metrics.close()
        if d.owns_group:
            dist.destroy_process_group()
    return {"run_dir": str(r.run_dir), "model_dir": str(r.run_dir / "model"), "steps": step,
            "tokens": tokens_seen, **last_eval}
