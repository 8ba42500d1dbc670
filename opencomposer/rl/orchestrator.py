"""Asynchronous agentic RL in one process: rollout workers and the trainer run concurrently.

    rollout workers (asyncio tasks, `rollout_workers` of them)        trainer loop
      issue a task id (buffer.DataCursor)                               wait for `groups_per_step`
      run its group: G rollouts in forked sandboxes,                    fresh-enough groups
        the engine as policy (rollout.py)                               Trainer.step (a thread)
      put the finished group in the ready list  ───────────────────►   sync weights to the engine
                                                                        mark the tasks trained
                                                                        metrics, checkpoint

Generation never waits for training: while the trainer computes step k, the workers keep
sampling with the engine's current weights, and when the sync lands the engine applies the new
weights *between two decode steps*, mid-rollout (PipelineRL's in-flight weight updates; AReaL
[Fu et al. 2505.24298] lets rollouts finish under the old weights instead). Every sampled token
records the policy version that produced it, so one trajectory may span several versions.

Staleness of a group = (trainer version when it is trained) − (oldest policy version of any of
its sampled tokens). A bound s = `max_staleness` is enforced two ways:

- "wait" (AReaL's rule, the default): a worker may start a group only while
  running + ready + training < (s + 1)·B groups (B = groups_per_step), so no more than s
  batches' worth of rollouts are generated ahead of the weights. s = 0 is synchronous RL:
  generate a batch, wait for all of it, train, sync, repeat. Groups that still end up too stale
  (one slow group finishing after younger ones were trained) are dropped as below.
- "drop": workers never wait; at training time a group staler than s is dropped and its task
  released to be rolled out again (up to `max_task_retries`, then given up and reported).

The trainer takes the oldest-version groups first. With `dynamic_sampling` (DAPO), groups whose
rollouts all tied do not count toward a step's B: they ride along in the next batch for free. A group whose rollouts mostly failed (see
rollout.py: sandbox crashes are retried, then counted) is released the same way.

Trained rollouts are appended to <out_dir>/trajectories.jsonl (routed experts left out).

Faults: a worker that dies (cancelled, or an unexpected exception) releases its task back to
the cursor and is replaced; its group's partial rollouts are discarded (their workspaces are
closed by the rollout's own `finally`). `state_dict()` (cursor + ready groups) goes into each
checkpoint (rl/checkpoint.py); in-flight tasks are re-issued on resume, so a killed run loses no
task and trains none twice.

Metrics per step (returned, and passed to `on_step`, which writes metrics.jsonl and TensorBoard
in `run_agentic`): the trainer's (loss, mismatch/*, replay/*, reward/*, staleness/mean|max per
sample ...), the sync's (sync/bytes_sent, ...), and staleness/hist_<k> (groups trained at
staleness k), staleness/group_max, inflight/multi_version_frac
(trajectories whose tokens span more than one policy version), groups/dropped_stale,
groups/riders (tied groups that rode along), groups/failed, rollouts/failed_attempts,
rollouts/resolved_frac, workers/restarts,
time/wait_s (trainer idle, waiting for data), time/train_s, time/sync_s, time/step_wall_s.

Left out: multiple trainer steps per batch (single epoch [R §4]), partial rollouts resumed
after a restart (a killed group is rolled out again from scratch), priorities between tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from opencomposer.harness.agent import AgentConfig
from opencomposer.rl.buffer import DataCursor, Group
from opencomposer.rl.config import AgenticConfig
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.rollout import PolicyFactory, RolloutGroup, run_group, to_group
from opencomposer.rl.run import INFERENCE, Run, build_trainer, inference_kind
from opencomposer.tasks.task import Task


class TrainerLike(Protocol):
    """What the orchestrator needs from a trainer (rl/trainer.py's Trainer, or a distributed one)."""

    version: int

    def step(self, groups: Sequence[Group]) -> dict[str, float]: ...


class Orchestrator:
    """One asynchronous RL run over `tasks` (module docstring).

    run_group_fn: async (task, start_version, group_id) -> RolloutGroup; default: rollout.run_group
    in this process with `make_policy`. sync: version -> metrics dict, called (in a thread) after
    each trainer step to push the new weights to the inference side. on_step(step, metrics):
    called between steps with the state consistent (checkpoint there).
    """

    def __init__(self, tasks: Sequence[Task], trainer: TrainerLike, sync: Callable[[int], dict],
                 cfg: AgenticConfig, reward_cfg: RewardConfig, *, make_policy: PolicyFactory | None = None,
                 run_group_fn=None, backend=None, seed: int = 0, out_dir: Path | str | None = None,
                 max_steps: int | None = None, on_step: Callable[[int, dict], None] | None = None):
        self.tasks = {t.id: t for t in tasks}
        self.trainer, self.sync, self.cfg, self.reward_cfg = trainer, sync, cfg, reward_cfg
        self.out_dir = Path(out_dir) if out_dir else None
        if run_group_fn is None:
            if make_policy is None:
                raise ValueError("give make_policy (local rollouts) or run_group_fn")
            run_group_fn = self._local_group_fn(make_policy, backend)
        self.run_group_fn = run_group_fn
        self.seed = seed
        self.cursor = DataCursor(list(self.tasks), seed=seed, shuffle=cfg.shuffle)
        self.max_steps, self.on_step = max_steps, on_step
        self.version = trainer.version
        self.step = 0
        self.ready: list[Group] = []
        self.retries: Counter[str] = Counter()
        self.given_up: list[str] = []
        self.history: list[dict] = []
        self.errors: list[str] = []                          # groups that raised (not rollout failures)
        self._running: dict[asyncio.Task, str | None] = {}   # worker -> the task id it is rolling out
        self._training = 0                                   # groups in the current step, until synced
        self._changed: asyncio.Condition | None = None
        self._done = False
        self._counts: Counter[str] = Counter()               # since the last step: dropped, failed, restarts...
        self._trained_trajs: list = []

    def _local_group_fn(self, make_policy: PolicyFactory, backend):
        from opencomposer.tasks.build import task_image

        images: dict[str, object] = {}
        save_dir = self.out_dir / "partial" if self.out_dir and self.cfg.save_trajectories else None

        async def fn(task: Task, start_version: int, group_id: str) -> RolloutGroup:
            if task.id not in images:
                images[task.id] = await asyncio.to_thread(task_image, task, backend)
            return await run_group(task, make_policy, self.cfg.rollout, self.reward_cfg, backend=backend,
                                   image=images[task.id], group_id=group_id, start_version=start_version,
                                   save_dir=save_dir, seed=self.seed)
        return fn

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict:
        """Cursor, ready groups (as buffer.Group dicts), retry counts: for rl/checkpoint.py."""
        return {"cursor": self.cursor.state_dict(), "buffer": [g.to_dict() for g in self.ready],
                "extra": {"retries": dict(self.retries), "given_up": list(self.given_up), "step": self.step}}

    def load_state_dict(self, cursor: dict, buffer: list[dict], extra: dict) -> None:
        """Restore from a checkpoint: ready groups come back, in-flight tasks are re-issued first."""
        self.ready = [Group.from_dict(d) for d in buffer]
        self.cursor.load_state_dict(cursor, buffered_ids=[g.task_id for g in self.ready])
        self.retries = Counter(extra.get("retries", {}))
        self.given_up = list(extra.get("given_up", []))
        self.step = int(extra.get("step", 0))

    # ---------------------------------------------------------------- bookkeeping

    def _informative(self, g: Group) -> bool:
        return not self.cfg.dynamic_sampling or len({s.reward for s in g.samples}) > 1

    def _outstanding(self) -> int:
        ready = sum(self._informative(g) for g in self.ready)
        return sum(t is not None for t in self._running.values()) + ready + self._training

    def _may_start(self) -> bool:
        if self.cfg.staleness_policy == "drop":
            return True
        return self._outstanding() < (self.cfg.max_staleness + 1) * self.cfg.groups_per_step

    def _release(self, task_id: str, why: str) -> None:
        """Give a task back for another try, or give it up after max_task_retries."""
        self.retries[task_id] += 1
        self._counts[why] += 1
        if self.retries[task_id] > self.cfg.max_task_retries:
            self.cursor.release([task_id])
            self.cursor.requeued.remove(task_id)  # given up: neither trained nor issued again
            self.given_up.append(task_id)
            self._counts["tasks_given_up"] += 1
        else:
            self.cursor.release([task_id])

    def _notify(self) -> None:
        async def wake():
            async with self._changed:
                self._changed.notify_all()
        asyncio.get_running_loop().create_task(wake())

    # ---------------------------------------------------------------- workers

    def _spawn_worker(self) -> None:
        w = asyncio.get_running_loop().create_task(self._worker())
        self._running[w] = None
        w.add_done_callback(self._worker_done)

    def _worker_done(self, w: asyncio.Task) -> None:
        task_id = self._running.pop(w, None)
        if self._done:
            return
        if task_id is not None:  # died mid-group: the task goes back, untrained
            self._release(task_id, "groups/killed")
        self._counts["workers/restarts"] += 1
        self._spawn_worker()
        self._notify()

    def kill_worker(self, task_id: str | None = None) -> str | None:
        """Cancel the worker rolling out `task_id` (default: any busy one); returns its task id."""
        for w, running in self._running.items():
            if running is not None and running == (task_id or running) and not w.done():
                w.cancel()
                return running
        return None

    async def _worker(self) -> None:
        me = asyncio.current_task()
        while True:
            async with self._changed:
                while True:
                    if self._done:
                        return
                    if self._may_start():
                        ids = self.cursor.next(1)
                        if ids:
                            break
                    await self._changed.wait()
            task_id = ids[0]
            self._running[me] = task_id
            group_id = f"{task_id}#{self.retries[task_id]}"
            try:
                group = await self.run_group_fn(self.tasks[task_id], self.version, group_id)
            except Exception as e:  # a bug or a dead remote worker: release the task, keep going
                self._running[me] = None
                self._counts["rollouts/errors"] += 1
                self.errors.append(f"{task_id}: {type(e).__name__}: {e}")
                self._release(task_id, "groups/failed")
                self._notify()
                continue
            self._running[me] = None
            self._counts["rollouts/failed_attempts"] += len(group.errors)
            if group.ok(self.cfg.rollout.min_group_size):
                self.ready.append(to_group(group, group_id))
                self._trained_trajs.append((group_id, group))
            else:
                self._release(task_id, "groups/failed")
            async with self._changed:
                self._changed.notify_all()

    # ---------------------------------------------------------------- trainer

    @staticmethod
    def _oldest(g: Group) -> int:
        vs = [v for s in g.samples if (v := s.oldest_version()) is not None]
        return min(vs) if vs else 0

    def _no_more_groups(self) -> bool:
        return self.cursor.remaining == 0 and not any(t is not None for t in self._running.values())

    async def _next_batch(self) -> list[Group]:
        """Wait for B groups within the staleness bound (fewer at the end of the data)."""
        B, s = self.cfg.groups_per_step, self.cfg.max_staleness
        async with self._changed:
            while True:
                for g in [g for g in self.ready if self.version - self._oldest(g) > s]:
                    self.ready.remove(g)
                    self._drop_rollouts(g.group_id)
                    self._release(g.task_id, "groups/dropped_stale")
                useful = sorted((g for g in self.ready if self._informative(g)), key=self._oldest)
                if len(useful) >= B or (self.ready and self._no_more_groups()):
                    riders = [g for g in self.ready if not self._informative(g)]  # dynamic sampling: free in the trainer
                    batch = useful[:B] + riders
                    self.ready = useful[B:]
                    self._training = len(useful[:B])
                    return batch
                if self._no_more_groups():
                    return []
                await self._changed.wait()

    def _drop_rollouts(self, group_id: str) -> None:
        self._trained_trajs = [(gid, g) for gid, g in self._trained_trajs if gid != group_id]

    async def run(self) -> list[dict]:
        """Run until the tasks run out or max_steps; returns the metrics of every step."""
        self._changed = asyncio.Condition()
        self._done = False
        for _ in range(self.cfg.rollout_workers):
            self._spawn_worker()
        try:
            while self.max_steps is None or self.step < self.max_steps:
                t0 = time.monotonic()
                batch = await self._next_batch()
                if not batch:
                    break
                t1 = time.monotonic()
                metrics = await asyncio.to_thread(self.trainer.step, batch)
                t2 = time.monotonic()
                trained_version = self.version
                self.version = self.trainer.version
                sync_metrics = await asyncio.to_thread(self.sync, self.version)
                t3 = time.monotonic()
                self.cursor.mark_trained(g.task_id for g in batch)
                self.step += 1
                self._training = 0
                metrics.update(sync_metrics)
                metrics.update(self._step_metrics(batch, trained_version))
                metrics.update({"step": self.step, "time/wait_s": t1 - t0, "time/train_s": t2 - t1,
                                "time/sync_s": t3 - t2, "time/step_wall_s": t3 - t0})
                self._write(batch)
                self.history.append(metrics)
                if self.on_step is not None:
                    self.on_step(self.step, metrics)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            self._done = True
            workers = list(self._running)
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._running.clear()
        return self.history

    def _step_metrics(self, batch: list[Group], trained_version: int) -> dict:
        stale = [trained_version - self._oldest(g) for g in batch]
        ids = {g.group_id for g in batch}
        rollouts = [r for gid, g in self._trained_trajs if gid in ids for r in g.rollouts]
        multi = [len({v for s in r.trajectory.segments for v, m in zip(s.policy_versions, s.loss_mask) if m}) > 1
                 for r in rollouts]
        m = {f"staleness/hist_{k}": float(n) for k, n in sorted(Counter(stale).items())}
        m.update({"staleness/group_max": float(max(stale)),
                  "inflight/multi_version_frac": float(np.mean(multi)) if multi else 0.0,
                  "rollouts/resolved_frac": float(np.mean([bool(r.trajectory.grade["resolved"]) for r in rollouts]))
                  if rollouts else 0.0, "groups/trained": float(len(batch)),
                  "groups/riders": float(sum(not self._informative(g) for g in batch)),
                  "tasks/trained_total": float(len(self.cursor.trained)),
                  "tasks/given_up_total": float(len(self.given_up))})
        for k in ("groups/dropped_stale", "groups/failed", "groups/killed", "rollouts/failed_attempts",
                  "rollouts/errors", "workers/restarts"):
            m[k] = float(self._counts.pop(k, 0))
        return m

    def _write(self, batch: list[Group]) -> None:
        ids = {g.group_id for g in batch}
        trained = [(gid, g) for gid, g in self._trained_trajs if gid in ids]
        self._trained_trajs = [(gid, g) for gid, g in self._trained_trajs if gid not in ids]
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.save_trajectories:
            with open(self.out_dir / "trajectories.jsonl", "a") as f:
                for gid, g in trained:
                    for r in g.rollouts:
                        r.trajectory.meta.update(step=self.step, group_id=gid)
                        f.write(r.trajectory.to_json(experts=False) + "\n")
            for gid, g in trained:  # finished episodes leave no partial file (as eval does)
                for r in g.rollouts:
                    for p in (self.out_dir / "partial").glob(f"{r.trajectory.id}.json*"):
                        p.unlink()


# ----------------------------------------------------------------------------- the run

def select_tasks(a: AgenticConfig) -> list[Task]:
    import fnmatch

    from opencomposer.errors import ConfigError
    from opencomposer.tasks.task import Suite

    suite = Suite.load(a.suite)
    tasks = [t for t in suite.tasks if any(fnmatch.fnmatch(t.id, g) for g in a.tasks)]
    if not tasks:
        raise ConfigError(f"agentic.tasks {a.tasks} match no task of {a.suite}")
    return tasks


def agent_config(cfg) -> AgentConfig:
    """The rollout's agent limits with the run's sampling and the engine's context window."""
    sc = cfg.sampling
    return cfg.agentic.rollout.agent.model_copy(update={
        "temperature": sc.temperature, "top_p": sc.top_p, "top_k": sc.top_k, "max_new_tokens": sc.max_new_tokens,
        "context_window": cfg.engine.max_len})


def run_agentic(cfg, *, resume: bool = False, make_policy: PolicyFactory | None = None,
                on_step: Callable[[int, dict], None] | None = None) -> dict:
    """`opencomposer rl --config FILE` for `mode: agentic` with the local runner (rl/cli.py picks it).

    The set-up every mode shares is rl/run.py's: the policy and trainer, where the policy
    generates (the embedded engine serving a copy of it, or, with weight_sync.mode "disk", a
    server at weight_sync.server_url), metrics.jsonl + TensorBoard, checkpoints every
    checkpoint.every_steps and at the end, `--resume` from the latest. This function adds the
    tasks and runs the Orchestrator. make_policy overrides the engine-backed policy (tests);
    on_step(step, metrics) runs after each step's metrics are written, before its checkpoint.
    """
    from opencomposer.harness.agent import TokenClientPolicy
    from opencomposer.sandbox import get_backend

    a = cfg.agentic
    run = Run.open(cfg, resume, on_step)
    tasks = select_tasks(a)
    tokenizer = run.tokenizer
    trainer = build_trainer(cfg, run.state, tokenizer)
    model = trainer.model
    inference = INFERENCE[inference_kind(cfg)](cfg, trainer, tokenizer, run.dir)
    replay = cfg.train.router_replay and bool(model.config.moe_layers) and inference.routed_experts
    if make_policy is None:
        policy = TokenClientPolicy(inference.client, tokenizer, name=f"rl:{run.dir.name}", routed_experts=replay)
        make_policy = lambda task: policy  # noqa: E731 (one shared client; the engine batches)
    cfg_run = a.model_copy(update={"rollout": a.rollout.model_copy(update={"agent": agent_config(cfg)})})
    run.open_metrics()
    orch = Orchestrator(tasks, trainer, lambda v: inference.sync.sync(model, v).as_metrics(), cfg_run, cfg.reward,
                        make_policy=make_policy, backend=get_backend(a.backend), seed=cfg.run.seed, out_dir=run.dir,
                        max_steps=cfg.train.max_steps, on_step=run.end_step)
    run.snapshot = lambda step: dict(model=model, trainer_state=trainer.state_dict(), version=trainer.version,
                                     **orch.state_dict())
    if run.state is not None:
        orch.load_state_dict(run.state.cursor, run.state.buffer, run.state.extra)
    t0 = time.perf_counter()
    try:
        asyncio.run(orch.run())
        run.finish(orch.step)
    finally:
        run.close()
        inference.close()
    return {"run_dir": str(run.dir), "steps": orch.step, "policy_version": trainer.version,
            "trained": list(orch.cursor.trained), "given_up": list(orch.given_up),
            "engine_version": inference.engine.policy_version if inference.engine is not None else None,
            "seconds": time.perf_counter() - t0}
