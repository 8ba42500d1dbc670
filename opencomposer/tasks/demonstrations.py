"""Demonstrations: a scripted policy run through the real agent loop on every task of a suite,
each in a fresh sandbox workspace of the task's image, its patch kept and optionally graded.

SFT's data (pretrain/sft.py) comes from here: by default the demo family's `ReadEditOracle`
(read the file, one minimal edit_file), or `demo_family.demonstrator`'s imperfect teacher,
in the collection environment `agent_config` names. Each trajectory is appended to a JSONL
file as it ends, so a collection that stops resumes where it was (tasks already in the file
are skipped).

Left out: sampling demonstrations from a model (RL's rollouts do that) and filtering them
(SFT's `data.resolved_only` does, when it renders).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Callable

import yaml
from pydantic import ValidationError

from opencomposer.errors import ConfigError
from opencomposer.harness.agent import Agent, AgentConfig
from opencomposer.harness.trajectory import Trajectory, read_jsonl, write_jsonl
from opencomposer.tasks.build import task_image
from opencomposer.tasks.demo_family import DEMO_AGENT, ReadEditOracle
from opencomposer.tasks.grade import grade as grade_patch
from opencomposer.tasks.task import Suite, diff_excludes


def agent_config(spec: str | dict | None) -> AgentConfig:
    """The collection environment: a YAML file, inline fields, or (None) the demo's."""
    if spec is None:
        return DEMO_AGENT
    if isinstance(spec, str):
        if not Path(spec).is_file():
            raise ConfigError(f"data.agent: {spec} does not exist (an AgentConfig YAML file)")
        spec = yaml.safe_load(Path(spec).read_text()) or {}
    try:
        return AgentConfig.model_validate(spec)
    except ValidationError as e:
        raise ConfigError(f"data.agent: invalid AgentConfig: {e}") from None


async def collect_trajectories(suite_dir: str | Path, out: str | Path, agent: AgentConfig, *,
                               make_policy: Callable | None = None, concurrency: int = 2, grade: bool = False,
                               backend=None, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Run `make_policy(task)` (default: the demo's ReadEditOracle) on every task of the suite
    through the agent loop, each in a fresh workspace of the task's image; append each
    trajectory (with its patch, and its grade when `grade`) to the JSONL file `out`. Tasks
    already in `out` are skipped. Returns every trajectory in `out`.

    Trajectories are appended as they finish (a crash keeps every finished one), so with
    concurrency > 1 the file's order is the order of finishing, which timing decides. At the
    end the file is rewritten in the suite's order (lines kept byte for byte; tasks of another
    suite after them, in file order), so that SFT on it, whose seeded shuffle starts from the
    file's order, gives the same weights from the same seed."""
    if make_policy is None:
        make_policy = ReadEditOracle
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    have = {t.task_id for t in read_jsonl(out)} if out.is_file() else set()
    tasks = Suite.load(suite_dir).tasks
    todo = [t for t in tasks if t.id not in have]
    sem, lock = asyncio.Semaphore(concurrency), asyncio.Lock()

    async def one(task) -> None:
        async with sem:
            image = await asyncio.to_thread(task_image, task, backend)
            ws = await asyncio.to_thread(image.workspace)
            try:
                policy = make_policy(task)
                meta = {"suite": str(suite_dir), "sft": True, "decoy": getattr(policy, "decoy", False),
                        "parallel": getattr(policy, "parallel", True), "verify": getattr(policy, "verify", False)}
                if getattr(policy, "survey", False):  # a habit added later: absent from older collections
                    meta["survey"] = True
                if getattr(policy, "untaught_turns", None):  # assistant turns SFT leaves out of its loss
                    meta["untaught_turns"] = list(policy.untaught_turns)
                traj = await Agent(policy, ws, agent, trajectory_id=f"{task.id}__sft",
                                   task_id=task.id, meta=meta).run(task.spec.instruction)
                traj.patch = await asyncio.to_thread(ws.diff, diff_excludes())
            finally:
                await asyncio.to_thread(ws.close)
            if grade:
                result = await asyncio.to_thread(grade_patch, task, traj.patch, backend=backend, image=image)
                traj.grade, traj.reward = result.to_json(), float(result.resolved)
        async with lock:
            write_jsonl([traj], out)
            if on_done:
                on_done(traj)

    await asyncio.gather(*(one(t) for t in todo))
    return [Trajectory.from_dict(d) for d in _in_suite_order(out, [t.id for t in tasks])]


def _in_suite_order(path: Path, task_ids: list[str]) -> list[dict]:
    """Rewrite the JSONL file `path` with its lines in the order of `task_ids` (atomically);
    return its records in that order."""
    rank = {tid: i for i, tid in enumerate(task_ids)}
    # split on "\n" alone: the lines are JSON written with ensure_ascii=False, so text in them may
    # hold U+2028 and the other breaks str.splitlines knows; the last piece is "" or a cut line
    lines = [line + "\n" for line in path.read_text().split("\n")[:-1]]
    records = [json.loads(line) for line in lines]
    order = sorted(range(len(lines)), key=lambda i: rank.get(records[i]["task_id"], len(rank)))
    if order != list(range(len(lines))):
        tmp = path.with_name(path.name + ".ordering")
        tmp.write_text("".join(lines[i] for i in order))
        os.replace(tmp, path)
    return [records[i] for i in order]
