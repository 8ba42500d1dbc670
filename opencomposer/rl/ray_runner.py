"""Agentic RL on Ray: the same config and orchestrator as the local runner, the pieces as actors.

    driver (this process)                  Ray actors
      Orchestrator (rl/orchestrator.py) ──► RolloutActor × rollout_actors   (spread over nodes)
        staleness bound, data cursor,         run_group: G rollouts in its node's sandboxes,
        checkpoints, metrics                  policy = InferenceActor (token ids over Ray)
                                       ──► InferenceActor                  (the embedded Engine
                                              in an actor; continuous batching across every
                                              rollout actor's requests; in-place weight updates)
                                       ──► TrainerActor × trainer_world_size
                                              torch.distributed (gloo on CPU, nccl on GPU),
                                              FSDP2 (model/parallelize.py: per block, per MTP
                                              module, and at the root), rl/trainer.py's Trainer

`runner: ray` in the `agentic` section is the only change from a local run; `agentic.ray` says
where (address, actors, trainer world size, GPUs). An actor computes on a GPU exactly when Ray
gave it one (`trainer_gpus`, `inference_gpus` > 0; run.device is the local runner's). Everything
crossing an actor boundary is plain data: task directories (paths every node can read), token
ids, GenerationResults, RolloutGroups (trajectories), buffer.Groups, state dicts.

Sandboxes: each rollout actor owns the sandboxes of the rollouts it runs (workspaces are mounts
on its node, so a rollout's tools must run where its workspace is); actors are spread over the
cluster's nodes. Data parallelism in the trainer: rank r trains on groups r, r+W, ... (each rank
gets every group when there are fewer groups than ranks); FSDP averages gradients over ranks.
Each rank does exactly one forward/backward per step (its shard is one micro-batch), because
FSDP's collectives need the same number of calls on every rank; with the "constant" aggregation
and `loss.loss_norm_tokens` set, the averaged gradient equals the single-process one when ranks
get equal sample counts. Weight sync: rank 0 gathers the full state dict (a collective over
the ranks), the driver diffs it against the last sync (weight_sync.DeltaTracker) and sends the
changed tensors to the inference actor, which applies them between two decode steps.

Faults: a rollout actor that dies mid-group surfaces as an error of that group; the task is
released (orchestrator) and the actor replaced. Checkpoints: the full model (rank 0's gather),
the full optimizer state, the version, the cursor and the ready groups (rl/checkpoint.py).

Left out: several inference actors behind a router, SGLang/vLLM servers as the inference
actors (run them yourself and use weight_sync.mode "disk" with the local runner), and
placement groups for GPU packing (actors ask for `num_gpus` only).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import socket
import time
from pathlib import Path
from typing import Callable, Sequence

import ray

from opencomposer.model.parallelize import apply_fsdp
from opencomposer.rl.orchestrator import Orchestrator, agent_config, select_tasks
from opencomposer.rl.run import Run, build_engine, load_models, run_tokenizer


def _cfg(cfg_json: dict):
    from opencomposer.rl.config import RLConfig

    return RLConfig.model_validate(cfg_json)


def _actor_device():
    """cuda:0 when Ray gave this actor a GPU (it sees only its own, as device 0), else the CPU:
    `agentic.ray.trainer_gpus` / `inference_gpus` decide, not run.device."""
    import torch

    if not ray.get_gpu_ids():
        return torch.device("cpu")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


@ray.remote(num_cpus=0, max_concurrency=1000)
class InferenceActor:
    """The embedded engine in an actor: token ids in, GenerationResults out."""

    def __init__(self, cfg_json: dict, state_dict: dict | None = None, version: int = 0):
        from opencomposer.rl.trainer import load_policy

        cfg = _cfg(cfg_json)
        model = load_policy(cfg.model, cfg.run.seed).requires_grad_(False).to(_actor_device())
        if state_dict is not None:
            model.load_state_dict(state_dict)
        self.engine = build_engine(cfg, model)
        self.engine.policy_version = version

    async def generate(self, input_ids: list[int], sampling, routed_experts: bool):
        from opencomposer.engine.types import GenerationRequest, behaviour_logprobs_mode

        return await self.engine.generate(GenerationRequest(input_ids, sampling, return_logprob=True,
                                                            return_routed_experts=routed_experts,
                                                            logprobs_mode=behaviour_logprobs_mode(sampling)))

    async def update_weights(self, state_dict: dict, version: int) -> int:
        return await asyncio.to_thread(self.engine.update_weights, state_dict, version)

    async def policy_version(self) -> int:
        return self.engine.policy_version


class RayTokenPolicy:
    """A harness `TokenPolicy` whose generate is a call to the InferenceActor."""

    def __init__(self, actor, tokenizer, routed_experts: bool, name: str = "ray-engine"):
        self.actor, self.tokenizer, self.routed_experts, self.name = actor, tokenizer, routed_experts, name

    async def generate(self, input_ids, sampling):
        return await self.actor.generate.remote(list(input_ids), sampling, self.routed_experts)


@ray.remote(num_cpus=0, max_concurrency=1000)
class RolloutActor:
    """Runs groups (rollout.run_group) with its node's sandboxes and the shared inference actor."""

    def __init__(self, cfg_json: dict, inference, routed_experts: bool):
        from opencomposer.sandbox import get_backend

        self.cfg = _cfg(cfg_json)
        self.backend = get_backend(self.cfg.agentic.backend)
        tok = run_tokenizer(self.cfg)
        self.policy = RayTokenPolicy(inference, tok, routed_experts)
        self.rollout = self.cfg.agentic.rollout.model_copy(update={"agent": agent_config(self.cfg)})
        self.images: dict[str, object] = {}

    async def run_group(self, task_dir: str, start_version: int, group_id: str):
        from opencomposer.rl.rollout import run_group
        from opencomposer.tasks.build import task_image
        from opencomposer.tasks.task import Task

        task = Task.load(task_dir)
        if task_dir not in self.images:
            self.images[task_dir] = await asyncio.to_thread(task_image, task, self.backend)
        return await run_group(task, lambda t: self.policy, self.rollout, self.cfg.reward, backend=self.backend,
                               image=self.images[task_dir], group_id=group_id, start_version=start_version,
                               seed=self.cfg.run.seed)

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
class TrainerActor:
    """One rank of the distributed trainer (rl/trainer.py's Trainer over an FSDP2 model)."""

    def __init__(self, cfg_json: dict, rank: int, world: int, init_method: str, ckpt_path: str | None = None):
        import torch.distributed as dist

        from opencomposer.rl.checkpoint import Checkpointer
        from opencomposer.rl.trainer import Trainer

        cfg = _cfg(cfg_json)
        self.rank, self.world = rank, world
        device = _actor_device()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                                world_size=world)
        state = Checkpointer(Path(ckpt_path).parent).load(ckpt_path) if ckpt_path else None
        model, ref = load_models(cfg, state, device)
        apply_fsdp(model)
        self.trainer = Trainer.from_config(cfg, model, ref)
        if state is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, self.trainer.optimizer, state.trainer["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
            self.trainer.version, self.trainer.steps = int(state.trainer["version"]), int(state.trainer["steps"])

    def step(self, groups: list, micro_batch: int) -> dict:
        mine = groups[self.rank::self.world] if len(groups) >= self.world else groups
        # One forward and backward per rank and step, whatever the advantages and prefixes: FSDP's
        # collectives pair the ranks' calls up, so neither skipping zero-advantage samples nor the
        # packed layout (one model call or two, by the data) may differ between ranks.
        self.trainer.train_cfg = self.trainer.train_cfg.model_copy(
            update={"micro_batch_size": micro_batch, "skip_zero_advantage": False, "pack_prefixes": False})
        return self.trainer.step(mine)

    def version(self) -> int:
        return self.trainer.version

    def full_state(self, optimizer: bool = False) -> dict | None:
        """Full (unsharded, CPU) model state, and optionally optimizer state, on rank 0 (a collective)."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        out = {"model": get_model_state_dict(self.trainer.model, options=opts)}
        if optimizer:
            out["optimizer"] = get_optimizer_state_dict(self.trainer.model, self.trainer.optimizer, options=opts)
        return out if self.rank == 0 else None

    def shutdown(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


class RayTrainer:
    """The orchestrator's TrainerLike over the TrainerActor ranks."""

    def __init__(self, actors: list, version: int):
        self.actors, self.version = actors, version

    def step(self, groups: Sequence) -> dict:
        W = len(self.actors)
        shards = [groups[r::W] for r in range(W)] if len(groups) >= W else [groups] * W
        micro = max(sum(len(g.samples) for g in s) for s in shards)
        results = ray.get([a.step.remote(list(groups), micro) for a in self.actors])
        self.version += 1
        return {**results[0], "trainer/world_size": float(W)}

    def full_state(self, optimizer: bool = False) -> dict:
        return ray.get([a.full_state.remote(optimizer) for a in self.actors])[0]


class RaySync:
    """Trainer ranks -> driver -> InferenceActor, sending only the tensors that changed."""

    def __init__(self, trainer: RayTrainer, inference, delta: bool):
        from opencomposer.rl.weight_sync import DeltaTracker

        self.trainer, self.inference = trainer, inference
        self.tracker = DeltaTracker() if delta else None

    def sync(self, version: int) -> dict:
        t0 = time.perf_counter()
        state = self.trainer.full_state()["model"]
        names = self.tracker.changed(state) if self.tracker is not None else list(state)
        ray.get(self.inference.update_weights.remote({n: state[n] for n in names}, version))
        if self.tracker is not None:
            self.tracker.commit(state, names)
        nbytes = lambda n: state[n].numel() * state[n].element_size()  # noqa: E731
        return {"sync/bytes_sent": float(sum(map(nbytes, names))), "sync/bytes_full": float(sum(map(nbytes, state))),
                "sync/tensors_sent": float(len(names)), "sync/tensors_total": float(len(state)),
                "sync/seconds": time.perf_counter() - t0}


class RolloutPool:
    """Hands groups to the least busy rollout actor; replaces an actor that died."""

    def __init__(self, make_actor: Callable[[], object], n: int):
        self.make_actor = make_actor
        self.actors = [make_actor() for _ in range(n)]
        self.busy = [0] * n
        self.replaced = 0

    async def run_group(self, task, start_version: int, group_id: str):
        i = min(range(len(self.actors)), key=self.busy.__getitem__)
        actor = self.actors[i]
        self.busy[i] += 1
        try:
            return await actor.run_group.remote(str(task.path), start_version, group_id)
        except ray.exceptions.RayActorError:
            if self.actors[i] is actor:  # replace it once, whichever of its groups noticed first
                self.actors[i] = self.make_actor()
                self.replaced += 1
            raise
        finally:
            self.busy[i] -= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ray(cfg, *, resume: bool = False, on_step: Callable[[int, dict], None] | None = None) -> dict:
    """Run `cfg` (mode agentic, runner ray); connects to agentic.ray.address or an already
    initialised Ray, else starts a local instance. Returns the same summary as run_agentic.
    The run directory, metrics and checkpoint cadence are rl/run.py's Run."""
    from opencomposer.errors import ConfigError
    from opencomposer.rl.trainer import load_policy

    a = cfg.agentic
    if cfg.weight_sync.mode != "in_place":
        raise ConfigError("runner 'ray' serves the policy from an InferenceActor: weight_sync.mode must be 'in_place'")
    run = Run.open(cfg, resume, on_step)
    run_dir = run.dir.resolve()
    state = run.state
    tasks = select_tasks(a)
    started = False
    if not ray.is_initialized():
        ray.init(address=a.ray.address, num_cpus=a.ray.num_cpus if a.ray.address is None else None,
                 include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                     p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p)}})
        started = True
    cfg_json = cfg.model_dump(mode="json")
    template = load_policy(cfg.model, cfg.run.seed)  # the layout checkpoints are saved in
    replay = cfg.train.router_replay and bool(template.config.moe_layers)
    W = a.ray.trainer_world_size
    init = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
    ranks = [TrainerActor.options(num_gpus=a.ray.trainer_gpus).remote(
        cfg_json, r, W, init, str(state.path.resolve()) if state else None) for r in range(W)]  # actors: another cwd
    trainer = RayTrainer(ranks, ray.get(ranks[0].version.remote()))
    inference = InferenceActor.options(num_gpus=a.ray.inference_gpus).remote(
        cfg_json, trainer.full_state()["model"], trainer.version)
    sync = RaySync(trainer, inference, cfg.weight_sync.delta)
    sync.sync(trainer.version)  # prime the delta tracker with what the inference actor serves
    serial = itertools.count()
    pool = RolloutPool(lambda: RolloutActor.options(  # named, so an operator (or a test) can find and kill one
        name=f"opencomposer-rollout-{run_dir.name}-{next(serial)}", namespace="opencomposer",
        scheduling_strategy="SPREAD").remote(cfg_json, inference, replay), a.ray.rollout_actors)
    run.open_metrics()

    def snapshot(step: int) -> dict:
        full = trainer.full_state(optimizer=True)
        model = copy.deepcopy(template)
        model.load_state_dict(full["model"])
        return dict(model=model, trainer_state={"optimizer": full["optimizer"], "version": trainer.version,
                                                "steps": step}, version=trainer.version, **orch.state_dict())

    def after_step(step: int, metrics: dict) -> None:
        metrics["workers/actors_replaced"] = float(pool.replaced)
        run.end_step(step, metrics)

    run.snapshot = snapshot
    orch = Orchestrator(tasks, trainer, sync.sync, a, cfg.reward, run_group_fn=pool.run_group, seed=cfg.run.seed,
                        out_dir=run_dir, max_steps=cfg.train.max_steps, on_step=after_step)
    if state is not None:
        orch.load_state_dict(state.cursor, state.buffer, state.extra)
    t0 = time.perf_counter()
    try:
        asyncio.run(orch.run())
        run.finish(orch.step)
        engine_version = ray.get(inference.policy_version.remote())
    finally:
        run.close()
        ray.get([r.shutdown.remote() for r in ranks])
        for actor in [*ranks, inference, *pool.actors]:
            ray.kill(actor)
        if started:
            ray.shutdown()
    return {"run_dir": str(run_dir), "steps": orch.step, "policy_version": trainer.version,
            "trained": list(orch.cursor.trained), "given_up": list(orch.given_up),
            "engine_version": engine_version, "seconds": time.perf_counter() - t0}
