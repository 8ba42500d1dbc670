"""The trainer step: groups of plain-data samples in, one Adam step and its metrics out.

`Trainer.step(groups)` does, for a batch of finished groups (buffer.Group):

  1. pad the samples into [B, T] tensors (inputs t_0..t_{T−2}, targets t_1..t_{T−1}; the loss
     mask, behaviour logprobs and routed experts aligned to the *targets*);
  2. if β = reward.kl_coef > 0: the frozen reference model's log-probs of the targets, and
     r_i ← r_i − β·Σ_t kl_t(behav, ref) over the sample's generated tokens (k1 by default:
     Composer 2's KL-in-reward; losses.kl_in_reward);
  3. advantages per group (advantages.compute_advantages: Dr. GRPO by default);
  4. drop the samples whose advantage is 0 (all of a degenerate group's): their loss and
     gradient are 0, so not running them changes nothing but the time (unless KL is in the
     loss; train.skip_zero_advantage); the normalisers below stay the whole batch's;
  5. per micro-batch (whole groups, their shared prefix run once: training/packing.py): forward with router replay (the engine's experts, the plausibility
     threshold train.replay_min_ratio; replaced experts counted), log π_θ(target) of
     logits / temperature, losses.policy_loss, backward of the loss scaled so the sum over
     micro-batches is the full-batch loss (below);
  6. clip the global grad norm, AdamW step (optim.warmup_steps of linear warm-up, then constant or
     a cosine decay to optim.min_lr_ratio), policy version += 1.

Loss normalisation over micro-batches (b = micro-batch, B samples in the batch):
    constant             Σ_b loss_b·B_b/B with one T_c for all (loss.loss_norm_tokens, else the
                         batch's padded length): exactly Σ L·m / (B·T_c), as one big batch.
    token_mean           Σ_b (Σ_b L·m)/N with N = the loss-mask tokens of the whole batch,
                         counted before any forward (masked-IS or decoupled-cap drops count in N;
                         on a single batch policy_loss would divide by the kept tokens instead).
    seq_mean_token_mean  Σ_b loss_b·S_b/S, S = sequences with ≥ 1 generated token.

Metrics (one flat dict of floats): loss, pg_loss, clip_frac_low/high, ratio_mean, masked_frac,
is_weight_*, grad_norm, entropy, mismatch/abs_logp_diff (mean |log π_θ − log μ| on generated
tokens) and mismatch/kl_k3 (KL(μ‖π_θ) by k3), replay/replaced_experts and replay/replaced_frac,
staleness/mean and /max (trainer version − the oldest version of each sample's tokens),
reward/mean|std, reward/kl (−β·Σ kl, mean), advantage/abs_mean, groups/degenerate_frac,
tokens/{total,generated}, tokens/s (train tokens per second of this step), time/step_s,
samples/skipped_zero_advantage. entropy and mismatch/* are over the samples that ran.

Covered: single-device training of opencomposer's Transformer (on the CPU or one GPU: the
model's device), one optimiser step per batch (single epoch, [R §4]). Left out: FSDP/multi-device
(model/parallelize.py shards `model` first; rl/ray_runner.py does), MTP losses during RL.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np
import torch

from opencomposer.rl.config import ModelSourceConfig, RLConfig, TrainConfig
from opencomposer.device import autocast
from opencomposer.errors import ConfigError
from opencomposer.model import ModelConfig, Transformer, load_pretrained
from opencomposer.rl.advantages import AdvantageConfig, compute_advantages, degenerate_groups
from opencomposer.rl.buffer import Group, Sample
from opencomposer.rl.losses import PolicyLossConfig, kl_in_reward, policy_loss
from opencomposer.rl.rewards import RewardConfig
from opencomposer.training.allocator import keep_freed_memory
from opencomposer.training.logits import head_logprobs
from opencomposer.training.packing import Packed, forward_packed, pack
from opencomposer.training.threads import StepThreads
from opencomposer.training.schedule import warmup_cosine_lr

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # model.dtype and engine.dtype names


def load_policy(src: ModelSourceConfig, seed: int = 0) -> Transformer:
    """The initial policy: a checkpoint directory, or a ModelConfig YAML initialised from `seed`.

    Calling it twice with the same arguments gives the same weights (the reference model and a
    resumed run's reference are rebuilt this way).
    """
    dtype = DTYPES[src.dtype]
    if src.path is not None:
        return load_pretrained(src.path, dtype=dtype).train()
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Transformer(ModelConfig.from_yaml(src.config))
    finally:
        torch.random.set_rng_state(state)
    return model.to(dtype).train()


def needs_reference(reward: RewardConfig, loss: PolicyLossConfig) -> bool:
    """Whether a frozen reference model is needed: for KL in the reward (β) or in the loss."""
    return reward.kl_coef > 0 or loss.kl_loss_coef > 0


@dataclass
class Batch:
    """Padded, target-aligned tensors for B samples (see the module docstring)."""

    input_ids_BT: torch.Tensor        # int64, t_0..t_{T-2} (right-padded with 0)
    target_ids_BT: torch.Tensor       # int64, t_1..t_{T-1}
    mask_BT: torch.Tensor             # bool, loss mask of the targets
    behav_logp_BT: torch.Tensor       # float32
    routed_BTYK: torch.Tensor | None  # int32, experts of the input positions; −1 = router's choice
    lengths_B: torch.Tensor           # int64, real input positions per row

    def to(self, device: torch.device) -> "Batch":
        """The same batch on `device` (itself where it already is)."""
        return Batch(**{f.name: None if (t := getattr(self, f.name)) is None else t.to(device) for f in fields(self)})

    def slice(self, i: int, j: int) -> "Batch":
        T = int(self.lengths_B[i:j].max())  # drop padding this micro-batch does not need
        return Batch(self.input_ids_BT[i:j, :T], self.target_ids_BT[i:j, :T], self.mask_BT[i:j, :T],
                     self.behav_logp_BT[i:j, :T],
                     None if self.routed_BTYK is None else self.routed_BTYK[i:j, :T], self.lengths_B[i:j])


def collate(samples: Sequence[Sample], moe_shape: tuple[int, int] | None) -> Batch:
    """Pad samples into a Batch. moe_shape = (Y, K) to build a replay tensor, None for no replay."""
    B = len(samples)
    T = max(len(s.token_ids) for s in samples) - 1
    inp = torch.zeros(B, T, dtype=torch.int64)
    tgt = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.bool)
    behav = torch.zeros(B, T, dtype=torch.float32)
    routed = None if moe_shape is None else torch.full((B, T, *moe_shape), -1, dtype=torch.int32)
    lengths = torch.zeros(B, dtype=torch.int64)
    for b, s in enumerate(samples):
        n = len(s.token_ids) - 1
        ids = torch.from_numpy(s.token_ids)
        inp[b, :n], tgt[b, :n] = ids[:-1], ids[1:]
        mask[b, :n] = torch.from_numpy(s.loss_mask[1:])
        behav[b, :n] = torch.from_numpy(s.behav_logprobs[1:])
        lengths[b] = n
        if routed is not None and s.routed_experts is not None:
            if s.routed_experts.shape[1:] != moe_shape:
                raise ValueError(f"sample {s.group_id}: routed_experts rows are {s.routed_experts.shape[1:]}, "
                                 f"the model's MoE layout is (Y, K) = {moe_shape}")
            routed[b, :n] = torch.from_numpy(s.routed_experts[:-1])
    return Batch(inp, tgt, mask, behav, routed, lengths)


def target_logprobs(logits_BTV: torch.Tensor, target_BT: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32, without materialising the log-softmax."""
    logits_BTV = logits_BTV.float()
    return logits_BTV.gather(-1, target_BT[..., None]).squeeze(-1) - torch.logsumexp(logits_BTV, dim=-1)


def trajectory_advantages(samples: Sequence[Sample], rewards_B: torch.Tensor, gid_B: torch.Tensor,
                          cfg: AdvantageConfig) -> torch.Tensor:
    """Group-relative advantages computed per trajectory, then broadcast to its segments [B].

    A self-summarized episode gives one sample per segment (`info["trajectory_id"]` ties them),
    all carrying the episode's final reward; counted per sample, an episode of S segments would
    weigh S times in its group's mean (rewards.broadcast_to_segments). A trajectory's reward is
    its segments' shared reward plus the sum of their per-segment terms beyond it (the KL-in-reward
    term sums over the whole episode): r_j = mean_s(base) + Σ_s (r_s − base). Samples without a
    trajectory id are trajectories of their own.

    With cfg.zero_failed_groups, groups whose trajectories all have `info["reward/correctness"]`
    0 get advantage 0 (a sample without that key counts as a success, so it never zeroes a group).
    """
    keys = [s.info.get("trajectory_id", ("sample", i)) for i, s in enumerate(samples)]
    index = {k: j for j, k in enumerate(dict.fromkeys(keys))}
    tid_B = torch.tensor([index[k] for k in keys])
    J = len(index)
    base_B = torch.tensor([s.reward for s in samples], dtype=rewards_B.dtype)
    zeros_J = torch.zeros(J, dtype=rewards_B.dtype)
    count_J = zeros_J.index_add(0, tid_B, torch.ones_like(base_B))
    r_J = zeros_J.index_add(0, tid_B, base_B) / count_J + zeros_J.index_add(0, tid_B, rewards_B - base_B)
    gid_J = torch.zeros(J, dtype=torch.long).index_copy(0, tid_B, gid_B.long())
    adv_J = compute_advantages(r_J, cfg, group_ids=gid_J)
    if cfg.zero_failed_groups:
        correct_B = torch.tensor([float(s.info.get("reward/correctness", 1.0)) for s in samples], dtype=adv_J.dtype)
        correct_J = torch.zeros(J, dtype=adv_J.dtype).scatter_reduce(0, tid_B, correct_B, "amax", include_self=False)
        n = int(gid_J.max()) + 1 if J else 0
        best_n = torch.zeros(n, dtype=adv_J.dtype).scatter_reduce(0, gid_J, correct_J, "amax", include_self=False)
        adv_J = adv_J.masked_fill(best_n[gid_J] <= 0, 0.0)
    return adv_J[tid_B]


@dataclass
class _Selected:
    """What a step runs forward and backward (Trainer._select)."""

    samples: list[Sample]
    batch: Batch
    adv_B: torch.Tensor                          # float32, on the model's device
    mbs: list[tuple[int, int, Packed | None]]    # micro-batches: sample ranges [i, j) of `batch`


@dataclass
class _Accumulated:
    """What the micro-batches of a step add up to (Trainer._backward)."""

    loss: float = 0.0
    replaced: int = 0
    diff_sum: float = 0.0     # Σ |log π_θ − log μ| over generated tokens
    entropy_sum: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, scaled_loss: float, m: dict[str, float], scale: float, tokens: float) -> None:
        """One micro-batch's loss and policy_loss metrics: loss terms add up like the loss, _max/_min
        keep the extreme, other metrics are per-token means weighted by its generated tokens."""
        self.loss += scaled_loss
        for k, v in m.items():
            if k in ("pg_loss", "kl_ref"):
                self.sums[k], self.weights[k] = self.sums.get(k, 0.0) + v * scale, 1.0
            elif tokens == 0:
                continue
            elif k.endswith(("_max", "_min")):
                better = max if k.endswith("_max") else min
                self.sums[k], self.weights[k] = better(self.sums.get(k, v), v), 1.0
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * tokens
                self.weights[k] = self.weights.get(k, 0.0) + tokens

    def metrics(self, n_run: int) -> dict[str, float]:
        """The policy-loss metrics, mismatch/* over the n_run generated tokens that ran, and the loss."""
        out = {k: v / self.weights[k] for k, v in self.sums.items()}
        out["mismatch/kl_k3"] = out.pop("kl_behav_k3", 0.0)
        out["mismatch/abs_logp_diff"] = self.diff_sum / max(n_run, 1)
        out["loss"] = self.loss
        return out


class Trainer:
    """Owns the policy being trained, its optimiser, the reference model and the policy version.

    model: the Transformer to train (put in train mode; its parameters with requires_grad are
    optimised, so freezing a tensor is `p.requires_grad_(False)` before construction).
    ref_model: the frozen reference for KL; built as a deep copy of `model` (the initial weights)
    when reward.kl_coef > 0 or loss.kl_loss_coef > 0 and none is given; β = 0 needs none.
    temperature: the sampling temperature, applied to the trainer's logits as the engine did.
    The step runs on the model's device (put the model, and ref_model, there first): batches are
    built on the host and moved; rewards and advantages (B numbers) stay on the host.
    """

    def __init__(self, model: Transformer, train: TrainConfig = TrainConfig(),
                 loss: PolicyLossConfig = PolicyLossConfig(), advantage: AdvantageConfig = AdvantageConfig(),
                 reward: RewardConfig = RewardConfig(), *, ref_model: Transformer | None = None,
                 temperature: float = 1.0, version: int = 0):
        keep_freed_memory()  # no mmap and page faults per large tensor, every step (training/allocator.py)
        self.model = model.train()
        self.device = next(model.parameters()).device
        self.train_cfg, self.loss_cfg, self.adv_cfg, self.reward_cfg = train, loss, advantage, reward
        self.temperature = temperature
        self.version = version
        self.steps = 0
        # torch's threads capped by the CPUs others leave free, refitted before each step (CPU only)
        self._threads = StepThreads() if self.device.type == "cpu" else None
        self.needs_ref = needs_reference(reward, loss)
        self.ref_model = None
        if self.needs_ref:
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(model)).eval()
            self.ref_model.requires_grad_(False)
        for prefix in train.frozen:
            hit = [p for name, p in model.named_parameters() if name.startswith(prefix)]
            if not hit:
                raise ConfigError(f"train.frozen: no parameter name starts with {prefix!r} "
                                  f"(names look like {next(iter(dict(model.named_parameters())))!r})")
            for p in hit:
                p.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("the model has no trainable parameters (every tensor has requires_grad=False)")
        o = train.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                           fused=True)  # one pass per tensor (pretrain/train.make_optimizer says why)
        cfg = model.config
        self._moe_shape = (len(cfg.moe_layers), cfg.num_experts_per_tok) if cfg.moe_layers and train.router_replay else None

    @classmethod
    def from_config(cls, cfg: RLConfig, model: Transformer, ref_model: Transformer | None = None) -> "Trainer":
        return cls(model, cfg.train, cfg.loss, cfg.advantage, cfg.reward, ref_model=ref_model,
                   temperature=cfg.sampling.temperature)

    # ---- the step ------------------------------------------------------------------------

    def _forward(self, model: Transformer, mb: Batch, packed: Packed | None,
                 replay: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(log π(target) [Bm, Tm] float32, 0 off the loss mask; entropy of π at each loss-mask
        position [M], no grad; replaced experts). The output head runs only where the loss needs
        it (most positions are prompt and tool output); packed, a position that several samples
        share runs once."""
        ratio = self.train_cfg.replay_min_ratio if replay else None
        Bm, Tm = mb.target_ids_BT.shape
        with autocast(self.device, self.train_cfg.dtype):
            if packed is None:
                out = model(mb.input_ids_BT, routed_experts=mb.routed_BTYK if replay else None,
                            replay_min_ratio=ratio, compute_logits=False)
                hidden_ND, replaced = out.hidden.flatten(0, 1), out.replaced_experts
            else:
                hidden_ND, _, replaced = forward_packed(model, packed, replay, ratio, compute_logits=False)
        # the output head and its log-softmax run in float32 whatever train.dtype
        idx_BT = packed.index_BT[:, :Tm] if packed is not None else \
            torch.arange(Bm * Tm, device=hidden_ND.device).view(Bm, Tm)
        mask = mb.mask_BT
        pos_U, inv_M = torch.unique(idx_BT[mask], return_inverse=True)
        logp_M, ent_U = head_logprobs(model.lm_head, hidden_ND[pos_U], inv_M, mb.target_ids_BT[mask],
                                      self.temperature, entropy=True)  # in chunks for a large vocabulary
        logp_BT = torch.zeros(Bm, Tm, dtype=logp_M.dtype, device=logp_M.device).index_put(mask.nonzero(as_tuple=True), logp_M)
        return logp_BT, ent_U[inv_M], replaced

    def _micro_batches(self, samples: Sequence[Sample], batch: Batch) -> list[tuple[int, int, Packed | None]]:
        """Sample ranges [i, j) per forward; packed, they hold whole groups (training/packing.py)."""
        B, mbs = len(samples), self.train_cfg.micro_batch_size
        if not self.train_cfg.pack_prefixes:
            return [(i, min(i + mbs, B), None) for i in range(0, B, mbs)]
        out, i = [], 0
        while i < B:
            j = i + 1
            while j < B and (j - i < mbs or samples[j].group_id == samples[j - 1].group_id):
                j += 1
            mb_samples = samples[i:j]
            out.append((i, j, pack([s.token_ids for s in mb_samples], [s.group_id for s in mb_samples],
                                   int(batch.lengths_B[i:j].max()), self._moe_shape,
                                   [s.routed_experts for s in mb_samples]).to(self.device)))
            i = j
        return out

    @torch.no_grad()
    def _ref_logprobs(self, batch: Batch, mbs: list[tuple[int, int, Packed | None]]) -> torch.Tensor:
        out = torch.zeros_like(batch.behav_logp_BT)
        for i, j, packed in mbs:
            mb = batch.slice(i, j)
            logp, _, _ = self._forward(self.ref_model, mb, packed, replay=False)  # the reference routes for itself
            out[i:j, :mb.input_ids_BT.shape[1]] = logp
        return out

    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One optimiser step on all samples of `groups`; returns the metrics (module docstring)."""
        t0 = time.perf_counter()
        samples = [s for g in groups for s in g.samples]
        if not samples:
            raise ValueError("Trainer.step needs at least one sample")
        if self._threads is not None:
            self._threads.fit()
        group_index = {g.group_id: i for i, g in enumerate(groups)}
        gid_B = torch.tensor([group_index[s.group_id] for s in samples])
        batch = collate(samples, self._moe_shape).to(self.device)
        metrics: dict[str, float] = {}

        ref_mbs = self._micro_batches(samples, batch) if self.needs_ref else None
        ref_logp_BT = self._ref_logprobs(batch, ref_mbs) if ref_mbs is not None else None
        rewards_B = self._rewards(samples, batch, ref_logp_BT, metrics)
        adv_B = trajectory_advantages(samples, rewards_B, gid_B, self.adv_cfg).float()
        run = self._select(samples, batch, adv_B, ref_mbs)
        metrics["samples/skipped_zero_advantage"] = float(len(samples) - len(run.samples))
        acc = self._backward(run, batch, ref_logp_BT)
        grad_norm, lr = self._optimizer_step()
        dt = time.perf_counter() - t0

        n_run = int(run.batch.mask_BT.sum()) if run.samples else 0
        metrics.update(acc.metrics(n_run))
        metrics["grad_norm"] = grad_norm
        metrics["entropy"] = acc.entropy_sum / max(n_run, 1)
        metrics.update(self._replay_metrics(acc.replaced, run))
        metrics.update(self._batch_metrics(samples, groups, batch, rewards_B, gid_B, adv_B))
        metrics["tokens/s"] = metrics["tokens/total"] / dt
        metrics["time/step_s"] = dt
        metrics["policy_version"] = float(self.version)
        metrics["lr"] = lr
        return metrics

    def _rewards(self, samples: Sequence[Sample], batch: Batch, ref_logp_BT: torch.Tensor | None,
                 metrics: dict[str, float]) -> torch.Tensor:
        """r_i, minus β·Σ_t kl_t(behav, ref) with KL in the reward [B] float64 (metrics["reward/kl"])."""
        rewards_B = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        if self.reward_cfg.kl_coef > 0:
            kl_B = kl_in_reward(batch.behav_logp_BT, ref_logp_BT, batch.mask_BT, self.reward_cfg.kl_estimator)
            kl_term_B = -self.reward_cfg.kl_coef * kl_B.double().cpu()
            rewards_B = rewards_B + kl_term_B
            metrics["reward/kl"] = kl_term_B.mean().item()
        return rewards_B

    def _select(self, samples: Sequence[Sample], batch: Batch, adv_B: torch.Tensor,
                ref_mbs: list[tuple[int, int, Packed | None]] | None) -> "_Selected":
        """The samples that run forward and backward, their batch, advantages and micro-batches.

        A sample with advantage 0 (every sample of a degenerate group) has loss and gradient 0
        under every policy_loss variant: it is not run. The normalisers stay the whole batch's
        (_backward), so the step is exactly the full batch's. KL-in-the-loss has a gradient of its own.
        """
        B = len(samples)
        skip = self.train_cfg.skip_zero_advantage and self.loss_cfg.kl_loss_coef == 0
        run_B = adv_B != 0 if skip else torch.ones(B, dtype=torch.bool)
        run, run_adv_B = list(samples), adv_B
        if not bool(run_B.all()):
            run = [samples[i] for i in run_B.nonzero().squeeze(1).tolist()]
            run_adv_B = adv_B[run_B]
        run_batch = collate(run, self._moe_shape).to(self.device) if run and len(run) < B else batch
        if not run:
            mbs = []
        elif run_batch is batch and ref_mbs is not None:  # nothing skipped: the reference's packing serves
            mbs = ref_mbs
        else:
            mbs = self._micro_batches(run, run_batch)
        return _Selected(run, run_batch, run_adv_B.to(self.device), mbs)

    def _micro_batch_loss_cfg(self, T: int) -> PolicyLossConfig:
        """policy_loss's config for one micro-batch, so that the scaled sum over micro-batches is the
        full-batch loss (module docstring); T = the whole batch's padded length."""
        agg = self.loss_cfg.aggregation
        if agg == "constant":
            return self.loss_cfg.model_copy(update={"loss_norm_tokens": self.loss_cfg.loss_norm_tokens or T})
        if agg == "token_mean":  # a per-micro-batch sum: "constant" with T_c = 1 is Σ L·m / B_b
            return self.loss_cfg.model_copy(update={"aggregation": "constant", "loss_norm_tokens": 1})
        return self.loss_cfg

    def _backward(self, run: "_Selected", batch: Batch, ref_logp_BT: torch.Tensor | None) -> "_Accumulated":
        """Forward and backward of every micro-batch, each loss scaled by its share of the whole
        batch (`batch`: its samples, generated tokens or sequences, counted before any skip)."""
        B, T = batch.mask_BT.shape
        n_mask = int(batch.mask_BT.sum())
        n_seq = int((batch.mask_BT.sum(-1) > 0).sum())
        agg = self.loss_cfg.aggregation
        mb_cfg = self._micro_batch_loss_cfg(T)
        self.optimizer.zero_grad(set_to_none=True)
        acc = _Accumulated()
        for i, j, packed in run.mbs:
            mb = run.batch.slice(i, j)
            Bm, Tm = mb.mask_BT.shape
            logp_BT, ent_M, n_rep = self._forward(self.model, mb, packed, replay=self._moe_shape is not None)
            acc.replaced += n_rep
            extra = {}
            if self.loss_cfg.off_policy in ("truncated_is", "masked_is"):
                extra["old_logp_BT"] = logp_BT.detach()   # one step per batch: π_old = π_θ before the step
            elif self.loss_cfg.off_policy == "decoupled":
                extra["prox_logp_BT"] = logp_BT.detach()
            if self.loss_cfg.kl_loss_coef > 0:
                extra["ref_logp_BT"] = ref_logp_BT[i:j, :Tm]
            loss, m = policy_loss(logp_BT, mb.behav_logp_BT, run.adv_B[i:j], mb.mask_BT, mb_cfg, **extra)
            if agg == "constant":
                scale = Bm / B
            elif agg == "token_mean":
                scale = Bm / max(n_mask, 1)
            else:
                scale = int((mb.mask_BT.sum(-1) > 0).sum()) / max(n_seq, 1)
            (loss * scale).backward()
            acc.add(loss.item() * scale, m, scale, float(mb.mask_BT.sum()))
            with torch.no_grad():
                mask = mb.mask_BT
                acc.diff_sum += (logp_BT.detach() - mb.behav_logp_BT).abs()[mask].sum().item()
                acc.entropy_sum += ent_M.sum().item()
            del logp_BT, loss
        return acc

    def _optimizer_step(self) -> tuple[float, float]:
        """Clip the global grad norm, AdamW at this step's lr; policy version += 1. Returns
        (grad norm before clipping, lr)."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        clip = self.train_cfg.optim.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else math.inf)
        lr = self.lr_at(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.steps += 1
        return float(grad_norm), lr

    def _replay_metrics(self, replaced: int, run: "_Selected") -> dict[str, float]:
        """Router replay: experts the plausibility threshold replaced, of the replayed (position,
        expert) pairs the forwards computed."""
        slots = 0
        if self._moe_shape is not None:
            slots = sum(int((run.batch.routed_BTYK[i:j, ..., 0] >= 0).sum()) if p is None else p.replay_rows()
                        for i, j, p in run.mbs) * self._moe_shape[1]
        return {"replay/replaced_experts": float(replaced), "replay/replaced_frac": replaced / slots if slots else 0.0}

    def _batch_metrics(self, samples: Sequence[Sample], groups: Sequence[Group], batch: Batch,
                       rewards_B: torch.Tensor, gid_B: torch.Tensor, adv_B: torch.Tensor) -> dict[str, float]:
        """Staleness (against the weights just trained), rewards, advantages, groups, tokens."""
        versions = [s.oldest_version() for s in samples]
        stale = [self.version - 1 - v for v in versions if v is not None]
        raw_rewards = np.array([s.reward for s in samples])
        return {"staleness/mean": float(np.mean(stale)) if stale else 0.0,
                "staleness/max": float(max(stale)) if stale else 0.0,
                "reward/mean": float(raw_rewards.mean()), "reward/std": float(raw_rewards.std()),
                "advantage/abs_mean": adv_B.abs().mean().item(), "groups/count": float(len(groups)),
                "groups/degenerate_frac": float(degenerate_groups(rewards_B, gid_B).float().mean()),
                "tokens/total": float(int(batch.lengths_B.sum()) + len(samples)),
                "tokens/generated": float(int(batch.mask_BT.sum()))}

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based): linear warm-up, then constant, or a cosine
        decay to lr x optim.min_lr_ratio at train.max_steps."""
        o, total = self.train_cfg.optim, self.train_cfg.max_steps
        if step >= o.warmup_steps and (o.min_lr_ratio is None or not total or total <= o.warmup_steps):
            return o.lr  # constant after the warm-up
        return warmup_cosine_lr(o.lr, step, o.warmup_steps, total or 0, o.min_lr_ratio or 1.0)

    # ---- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything but the model weights (saved as an HF directory by checkpoint.py)."""
        return {"optimizer": self.optimizer.state_dict(), "version": self.version, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.steps = int(state["steps"])
