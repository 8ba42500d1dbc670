"""Plain-data samples and groups, the buffer of finished groups, and the single-epoch data cursor.

A `Sample` is one sequence as the trainer sees it: token ids, a loss mask over the tokens the
model generated, the behaviour log-probabilities the engine reported, the experts the engine
routed each position to, and the policy version each generated token was sampled under. It is
built by whoever produced the tokens (single_turn.py from an engine result; the agentic
rollout from a Trajectory, one Sample per self-summarization segment) and holds numpy arrays
only, so it pickles, crosses a Ray boundary and goes into a checkpoint unchanged.

Array layout (T = len(token_ids), Y = MoE layers, K = experts per token):

    token_ids        int64   [T]        prompt + completion (+ tool output ...), never re-tokenised
    loss_mask        bool    [T]        True on model-generated tokens only
    behav_logprobs   float32 [T]        log μ(token_t | < t) where loss_mask, 0 elsewhere
    routed_experts   int32   [T, Y, K]  experts of *input position* t (the forward that predicts
                                        token t+1); a row of −1 lets the trainer's router choose
    policy_versions  int64   [T]        version that sampled token t where loss_mask, −1 elsewhere

A `Group` is the G samples of one task/prompt (Dr. GRPO compares within it). `GroupBuffer` is a
FIFO of finished groups waiting for the trainer. `DataCursor` hands out task ids in a fixed
seeded order, exactly once each (single epoch, [R §4]): ids are *issued* when rollouts start,
*trained* when the step that used them finishes, and *released* back to the front of the queue
when their rollouts fail or are dropped (e.g. too stale), so a task is never lost and never
trained twice. After a crash, issued ids that are neither trained nor in the saved buffer are
re-issued first (`DataCursor.load_state_dict`).

Left out: staleness policies (drop or wait) and asynchrony, which live in the orchestrator.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch


@dataclass
class Sample:
    """One sequence for the trainer (module docstring for the arrays)."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    behav_logprobs: np.ndarray
    reward: float
    group_id: str
    task_id: str
    routed_experts: np.ndarray | None = None
    policy_versions: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """JSON-able extras for metrics and debugging (reward components, finish reason, text)."""

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64)
        self.loss_mask = np.asarray(self.loss_mask, dtype=bool)
        self.behav_logprobs = np.asarray(self.behav_logprobs, dtype=np.float32)
        T = len(self.token_ids)
        if self.token_ids.ndim != 1 or T < 2:
            raise ValueError(f"sample {self.group_id}/{self.task_id}: token_ids must be 1-D with ≥ 2 tokens, got shape {self.token_ids.shape}")
        if self.loss_mask.shape != (T,) or self.behav_logprobs.shape != (T,):
            raise ValueError(f"sample {self.group_id}: loss_mask {self.loss_mask.shape} and behav_logprobs "
                             f"{self.behav_logprobs.shape} must both be [{T}] like token_ids")
        if self.loss_mask[0]:
            raise ValueError(f"sample {self.group_id}: token 0 cannot be in the loss mask (nothing predicts it)")
        if self.routed_experts is not None:
            self.routed_experts = np.asarray(self.routed_experts, dtype=np.int32)
            if self.routed_experts.ndim != 3 or self.routed_experts.shape[0] != T:
                raise ValueError(f"sample {self.group_id}: routed_experts must be [T={T}, Y, K], got {self.routed_experts.shape}")
        if self.policy_versions is not None:
            self.policy_versions = np.asarray(self.policy_versions, dtype=np.int64)
            if self.policy_versions.shape != (T,):
                raise ValueError(f"sample {self.group_id}: policy_versions must be [{T}], got {self.policy_versions.shape}")
        self.reward = float(self.reward)

    @property
    def num_generated(self) -> int:
        return int(self.loss_mask.sum())

    def oldest_version(self) -> int | None:
        """The oldest policy version among the generated tokens (what staleness is measured from)."""
        if self.policy_versions is None or not self.loss_mask.any():
            return None
        return int(self.policy_versions[self.loss_mask].min())

    def to_dict(self) -> dict[str, Any]:
        """Tensors and plain values only, so torch.load(weights_only=True) reads it back."""
        d = {"token_ids": torch.from_numpy(self.token_ids), "loss_mask": torch.from_numpy(self.loss_mask),
             "behav_logprobs": torch.from_numpy(self.behav_logprobs), "reward": self.reward,
             "group_id": self.group_id, "task_id": self.task_id, "info": self.info}
        if self.routed_experts is not None:
            d["routed_experts"] = torch.from_numpy(self.routed_experts)
        if self.policy_versions is not None:
            d["policy_versions"] = torch.from_numpy(self.policy_versions)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sample":
        arrays = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        return cls(**arrays)


@dataclass
class Group:
    """The G samples of one task (a sample may be missing if its rollout crashed)."""

    group_id: str
    task_id: str
    samples: list[Sample]

    def to_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "task_id": self.task_id, "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Group":
        return cls(d["group_id"], d["task_id"], [Sample.from_dict(s) for s in d["samples"]])


class GroupBuffer:
    """FIFO of finished groups waiting for a trainer step."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: Group) -> None:
        self._groups.append(group)

    def take(self, n: int) -> list[Group]:
        """Up to n groups, oldest first."""
        return [self._groups.popleft() for _ in range(min(n, len(self._groups)))]

    def task_ids(self) -> list[str]:
        return [g.task_id for g in self._groups]

    def state_dict(self) -> list[dict[str, Any]]:
        return [g.to_dict() for g in self._groups]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self._groups = deque(Group.from_dict(d) for d in state)


class DataCursor:
    """Single-epoch, crash-safe order of task ids (module docstring).

    `order` is a seeded permutation of `task_ids` (or their order when shuffle is False).
    """

    def __init__(self, task_ids: Sequence[str], seed: int = 0, shuffle: bool = True):
        ids = [str(t) for t in task_ids]
        if len(set(ids)) != len(ids):
            dup = sorted({t for t in ids if ids.count(t) > 1})[:5]
            raise ValueError(f"task ids must be unique; duplicated: {dup}")
        self.order = list(ids)
        if shuffle:
            random.Random(seed).shuffle(self.order)
        self.position = 0                      # next index of `order` never issued yet
        self.requeued: deque[str] = deque()    # released ids, handed out again first
        self.in_flight: dict[str, None] = {}   # issued, not yet trained (insertion-ordered set)
        self.trained: list[str] = []           # in training order

    @property
    def remaining(self) -> int:
        """Ids not yet issued (including released ones)."""
        return len(self.order) - self.position + len(self.requeued)

    @property
    def exhausted(self) -> bool:
        """Every id has been trained."""
        return self.remaining == 0 and not self.in_flight

    def next(self, n: int) -> list[str]:
        """Issue up to n ids: released ones first, then new ones in order."""
        out = []
        while len(out) < n and self.requeued:
            out.append(self.requeued.popleft())
        while len(out) < n and self.position < len(self.order):
            out.append(self.order[self.position])
            self.position += 1
        self.in_flight.update(dict.fromkeys(out))
        return out

    def mark_trained(self, ids: Iterable[str]) -> None:
        for t in ids:
            if t not in self.in_flight:
                raise ValueError(f"task {t!r} was not in flight: training it would break single-epoch bookkeeping")
            del self.in_flight[t]
            self.trained.append(t)

    def release(self, ids: Iterable[str]) -> None:
        """Give ids back (failed or dropped rollouts): they are issued again before new ones."""
        for t in ids:
            if t in self.in_flight:
                del self.in_flight[t]
                self.requeued.append(t)

    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "position": self.position, "requeued": list(self.requeued),
                "in_flight": list(self.in_flight), "trained": list(self.trained)}

    def load_state_dict(self, state: dict[str, Any], buffered_ids: Iterable[str] = ()) -> None:
        """Restore; in-flight ids whose groups are not in the restored buffer are re-issued first
        (their rollouts died with the process)."""
        if sorted(state["order"]) != sorted(self.order):
            raise ValueError("the checkpoint's task ids differ from this dataset's: resuming would lose or repeat tasks")
        self.order = list(state["order"])
        self.position = int(state["position"])
        buffered = set(buffered_ids)
        lost = [t for t in state["in_flight"] if t not in buffered]
        self.requeued = deque(lost + [t for t in state["requeued"] if t not in lost])
        self.in_flight = dict.fromkeys(t for t in state["in_flight"] if t in buffered)
        self.trained = list(state["trained"])
