"""The demo family: deterministic generation, held-out instances that are new, tasks that the real
grader validates (gold resolves, no change fails), and the read-then-edit oracle through the agent loop."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import random
import re
from pathlib import Path

import pytest

from opencomposer.errors import TaskError
from opencomposer.harness.agent import Agent
from opencomposer.tasks.build import task_image
from opencomposer.tasks.demo_family import (DECOY_PATCH, DEMO_AGENT, TEMPLATES, ReadEditOracle, demonstrator, habits,
                                            generate_tasks, instance_hash, make_instance, make_two_file_instance,
                                            minimal_edits, surveys, two_file, writes_decoy)
from opencomposer.tasks.grade import grade
from opencomposer.tasks.policies import parse_patch
from opencomposer.tasks.task import Suite, Task, tree_diff


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_is_deterministic_and_seeds_differ(tmp_path):
    generate_tasks(12, 3, tmp_path / "a", difficulty=2)
    generate_tasks(12, 3, tmp_path / "b", difficulty=2)
    generate_tasks(12, 4, tmp_path / "c", difficulty=2)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert {t.id for t in Suite.load(tmp_path / "a").tasks} != {t.id for t in Suite.load(tmp_path / "c").tasks}


def test_held_out_suite_shares_no_instance_with_the_training_suite(tmp_path):
    train = generate_tasks(40, 0, tmp_path / "train", difficulty=0)
    held = generate_tasks(40, 1, tmp_path / "held", difficulty=0, exclude={p.name for p in train})
    assert len(held) == 40
    assert not {instance_hash(p.name) for p in train} & {instance_hash(p.name) for p in held}


@pytest.mark.parametrize("difficulty", [0, 1, 3])
def test_difficulty_is_the_number_of_distractor_functions(difficulty):
    rng = random.Random(0)
    for _ in range(20):
        inst = make_instance(rng, difficulty)
        module = inst.broken[inst.module_path]
        assert module.count("def ") == 1 + difficulty
        assert len(inst.tests) == 1 + difficulty
        # exactly one line differs between the broken and the gold module
        diff = [(a, b) for a, b in zip(module.splitlines(), inst.gold[inst.module_path].splitlines()) if a != b]
        assert len(diff) == 1


def test_bad_difficulty_is_refused():
    with pytest.raises(TaskError, match="difficulty"):
        make_instance(random.Random(0), 9)


def test_tasks_validate_through_the_real_grader(tmp_path, backend):
    paths = generate_tasks(4, 7, tmp_path, difficulty=2)
    for p in paths:
        task = Task.load(p)
        test_file, f2p_name = task.spec.tests.fail_to_pass[0].split("::")
        assert f"def {f2p_name}(" not in (task.workspace_dir / test_file).read_text()  # hidden from the agent
        assert f"def {f2p_name}(" in task.hidden_tests()[test_file].decode()
        gold = grade(task, task.gold_patch, backend=backend)
        assert gold.resolved, (task.id, gold.tests, gold.log)
        assert gold.p2p_total == 2
        none = grade(task, "", backend=backend)
        assert not none.resolved and none.f2p_passed == 0 and none.p2p_passed == none.p2p_total


def test_minimal_edits_widen_only_when_the_line_is_not_unique():
    text = "def f(a, b):\n    return a - b\n\n\ndef g(a, b):\n    return a - b\n"
    gold = "def f(a, b):\n    return a - b\n\n\ndef g(a, b):\n    return a + b\n"
    (hunks,) = [fp.hunks for fp in parse_patch(tree_diff({"m.py": text}, {"m.py": gold}))]
    ((old, new),) = minimal_edits("m.py", text, hunks)
    assert text.count(old) == 1 and text.replace(old, new) == gold
    assert "def g" in old  # "return a - b" alone occurs twice

    unique = "def f(x):\n    return x * 3\n"
    (hunks,) = [fp.hunks for fp in parse_patch(tree_diff({"m.py": unique}, {"m.py": "def f(x):\n    return x * 4\n"}))]
    assert minimal_edits("m.py", unique, hunks) == [("return x * 3", "return x * 4")]


def test_read_edit_oracle_resolves_in_two_tool_calls_through_the_agent_loop(tmp_path, backend):
    (path,) = generate_tasks(1, 11, tmp_path, difficulty=1)
    task = Task.load(path)
    ws = task_image(task, backend).workspace()
    try:
        traj = asyncio.run(Agent(ReadEditOracle(task), ws, DEMO_AGENT, task_id=task.id).run(task.spec.instruction))
        patch = ws.diff((".venv", "__pycache__", ".pytest_cache"))
    finally:
        ws.close()
    assert traj.stop_reason == "final"
    assert [r.name for r in traj.tool_calls] == ["read_file", "edit_file"] and all(r.ok for r in traj.tool_calls)
    assert [t["function"]["name"] for t in traj.tools] == ["read_file", "edit_file"]
    assert grade(task, patch, backend=backend).resolved


def test_every_bug_form_has_a_decoy_that_edits_the_broken_line_differently(tmp_path):
    wordings = {b.says.removeprefix("`{f}` in {path} ") for t in TEMPLATES for b in t.bugs}
    assert all(b.decoy not in (t.expr, b.expr) for t in TEMPLATES for b in t.bugs)
    seen = set()
    rng = random.Random(1)
    for _ in range(400):  # make_instance refuses a decoy the test cases cannot tell from the fix
        inst = make_instance(rng, 1)
        broken, gold, decoy = (m.splitlines() for m in (inst.broken[inst.module_path], inst.gold[inst.module_path],
                                                        inst.decoy[inst.module_path]))
        changed = [i for i, (a, b) in enumerate(zip(broken, gold)) if a != b]
        assert [i for i, (a, b) in enumerate(zip(broken, decoy)) if a != b] == changed
        assert decoy[changed[0]] != gold[changed[0]]
        seen.add(re.sub(r"\d+", "{c}", re.sub(r"^`\w+` in \S+ ", "", inst.instruction)))
    assert seen == wordings  # every bug form was drawn and checked


def test_the_decoy_fix_fails_the_hidden_test_through_the_agent_loop_and_the_grader(tmp_path, backend):
    paths = generate_tasks(4, 7, tmp_path, difficulty=1)
    for p in paths:
        task = Task.load(p)
        ws = task_image(task, backend).workspace()
        try:
            traj = asyncio.run(Agent(ReadEditOracle(task, decoy=True), ws, DEMO_AGENT, task_id=task.id)
                               .run(task.spec.instruction))
            patch = ws.diff((".venv", "__pycache__", ".pytest_cache"))
        finally:
            ws.close()
        assert traj.stop_reason == "final" and all(r.ok for r in traj.tool_calls)
        assert [r.name for r in traj.tool_calls] == ["read_file", "edit_file"]
        result = grade(task, patch, backend=backend)
        assert not result.resolved and result.f2p_passed == 0 and result.p2p_passed == result.p2p_total, task.id
        assert grade(task, (p / DECOY_PATCH).read_text(), backend=backend).resolved is False


def test_the_demonstrator_writes_decoys_at_its_rate_deterministically(tmp_path):
    ids = [f"task-{i}" for i in range(4000)]
    share = sum(writes_decoy(i, 0.3) for i in ids) / len(ids)
    assert 0.27 < share < 0.33
    assert [writes_decoy(i, 0.3) for i in ids] == [writes_decoy(i, 0.3) for i in ids]
    assert [writes_decoy(i, 0.3, seed=1) for i in ids] != [writes_decoy(i, 0.3) for i in ids]
    assert not any(writes_decoy(i, 0.0) for i in ids) and all(writes_decoy(i, 1.0) for i in ids)
    (path,) = generate_tasks(1, 3, tmp_path / "s", difficulty=0)
    task = Task.load(path)
    assert demonstrator(1.0)(task).decoy and not demonstrator(0.0)(task).decoy
    edit_decoy = demonstrator(1.0)(task).plan[1]["tool_calls"][0]["function"]["arguments"]
    edit_gold = demonstrator(0.0)(task).plan[1]["tool_calls"][0]["function"]["arguments"]
    assert edit_decoy != edit_gold
    with pytest.raises(TaskError, match="decoy_rate"):
        demonstrator(1.5)
    (path / DECOY_PATCH).unlink()
    with pytest.raises(TaskError, match="regenerate"):
        ReadEditOracle(task, decoy=True)


# ----------------------------------------------------------------------------- issue 21: the easy/hard mix


def test_without_two_file_tasks_the_generator_draws_what_it_drew_before(tmp_path):
    # the tree's hash as the generator wrote it before two-file tasks existed (same seed and
    # difficulty): make demo's default tasks, and so its seeded runs, are unchanged
    generate_tasks(24, 9, tmp_path, difficulty=1)
    digest = hashlib.sha256()
    for p in sorted(tmp_path.rglob("*")):
        if p.is_file():
            digest.update(p.relative_to(tmp_path).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    assert digest.hexdigest() == "640bc220f05953261bee5669f673dd378a5e7b78fc5ad703d29c206093a77b56"


def test_two_file_tasks_have_a_named_bug_in_each_of_two_modules(tmp_path):
    rng = random.Random(4)
    for _ in range(30):
        inst = make_two_file_instance(rng, 1)
        assert inst.kind == "two_file" and len(inst.parts) == 2
        paths = [part.module_path for part in inst.parts]
        assert len(set(paths)) == 2 and all(p.startswith(inst.package + "/") for p in paths)
        assert all(f"`{part.broken_test.removeprefix('test_')}` in {part.module_path}" in inst.instruction
                   for part in inst.parts)
        for m in paths:  # one broken line per module, and the decoy edits that line otherwise
            broken, gold, decoy = (x.splitlines() for x in (inst.broken[m], inst.gold[m], inst.decoy[m]))
            changed = [i for i, (a, b) in enumerate(zip(broken, gold)) if a != b]
            assert len(changed) == 1
            assert [i for i, (a, b) in enumerate(zip(broken, decoy)) if a != b] == changed
    paths = generate_tasks(40, 2, tmp_path / "mix", difficulty=0, two_file_rate=0.5)
    kinds = [two_file(Task.load(p)) for p in paths]
    assert 10 < sum(kinds) < 30
    with pytest.raises(TaskError, match="two_file_rate"):
        generate_tasks(1, 0, tmp_path / "bad", two_file_rate=1.5)


def _run(task: Task, policy, backend, max_turns: int):
    ws = task_image(task, backend).workspace()
    try:
        agent = DEMO_AGENT.model_copy(update={"max_turns": max_turns})
        traj = asyncio.run(Agent(policy, ws, agent, task_id=task.id).run(task.spec.instruction))
        return traj, ws.diff((".venv", "__pycache__", ".pytest_cache"))
    finally:
        ws.close()


def test_two_file_tasks_and_the_demonstrators_habits_through_the_agent_loop_and_the_grader(tmp_path, backend):
    from opencomposer.eval.results import TRAJECTORIES
    from opencomposer.harness.trajectory import write_jsonl
    from opencomposer.pipeline_report import efficiency, episode_shape, plot_efficiency, rl_efficiency, suite_files

    paths = generate_tasks(12, 5, tmp_path / "s", difficulty=0, two_file_rate=0.5)
    hard = next(Task.load(p) for p in paths if two_file(Task.load(p)))
    easy = next(Task.load(p) for p in paths if not two_file(Task.load(p)))
    assert not grade(hard, "", backend=backend).resolved
    decoy = grade(hard, (hard.path / DECOY_PATCH).read_text(), backend=backend)
    assert not decoy.resolved and decoy.f2p_passed == 0 and decoy.f2p_total == 2
    trajs = []
    for task, parallel, verify, survey, turns, calls in (
            (hard, True, False, False, 3, [["read_file"] * 2, ["edit_file"] * 2]),
            (hard, False, True, False, 6, [["read_file"], ["read_file"], ["edit_file"], ["edit_file"], ["read_file"]]),
            (easy, False, True, False, 4, [["read_file"], ["edit_file"], ["read_file"]]),
            (hard, True, False, True, 4, [["read_file"], ["read_file"] * 2, ["edit_file"] * 2]),
            (easy, True, False, True, 4, [["read_file"], ["read_file"], ["edit_file"]]),
            # __init__.py and one module read in one turn, the other module after: two reads in a
            # turn, but not of the two files the episode edits, so not a parallel read
            (hard, False, False, "merged", 5, [["read_file"] * 2, ["read_file"], ["edit_file"], ["edit_file"]])):
        policy = ReadEditOracle(task, parallel=parallel, verify=verify, survey=bool(survey))
        if survey == "merged":
            first = policy.plan.pop(0)
            policy.plan[0] = {**policy.plan[0], "tool_calls": first["tool_calls"] + policy.plan[0]["tool_calls"]}
        assert survey is False or policy.plan[0]["tool_calls"][0]["function"]["arguments"] == \
            f'{{"path": "{task.spec.source.package}/__init__.py"}}'
        traj, patch = _run(task, policy, backend, 7)
        assert traj.stop_reason == "final" and traj.counts.turns == turns and all(r.ok for r in traj.tool_calls)
        by_turn: dict[int, list[str]] = {}
        for r in traj.tool_calls:
            by_turn.setdefault(r.turn, []).append(r.name)
        assert [by_turn[t] for t in sorted(by_turn)] == calls
        result = grade(task, patch, backend=backend)
        assert result.resolved
        traj.reward = 1.0
        trajs.append(traj)
    out = tmp_path / "eval"
    out.mkdir()
    write_jsonl(trajs, out / TRAJECTORIES)
    e = efficiency(out, tmp_path / "s")  # the report's figures on these real episodes
    assert e["hard"]["solved"] == 4 and e["hard"]["turns_per_solved"] == 4.5
    assert e["hard"]["parallel_read_frac"] == 0.5 and e["hard"]["verify_frac"] == 0.25
    assert e["hard"]["survey_frac"] == 0.5
    assert e["easy"]["solved"] == 2 and e["easy"]["turns_per_solved"] == 4 and e["easy"]["verify_frac"] == 0.5
    assert e["easy"]["survey_frac"] == 0.5
    # an episode whose edits failed still read both patched files in one turn (the gold patch says
    # which); without the patch's files, the files an episode edited are all episode_shape knows
    failed = copy.deepcopy(trajs[0])
    failed.tool_calls = [r for r in failed.tool_calls if r.name != "edit_file"]
    assert episode_shape(failed, suite_files(tmp_path / "s")[1][hard.id])["parallel_read"]
    assert not episode_shape(failed)["parallel_read"] and episode_shape(trajs[0])["parallel_read"]
    # the report's RL curve on the same episodes as two RL steps of three rollouts each, and its plot
    for i, t in enumerate(trajs):
        t.meta["step"] = 1 + i // 3
    (tmp_path / "rl").mkdir()
    write_jsonl(trajs, tmp_path / "rl" / "trajectories.jsonl")
    curve = rl_efficiency(tmp_path / "rl", tmp_path / "s")
    assert curve["step"] == [1, 2] and curve["parallel_read_frac"] == [0.5, 0.5] and curve["turns"] == [13 / 3] * 2
    assert curve["survey_frac"] == [0.0, 1.0] and curve["verify_frac"] == [2 / 3, 0.0]
    assert plot_efficiency({"sft": e, "rl": e}, curve, tmp_path / "efficiency.png").stat().st_size > 10_000
    assert e["easy"]["effort_per_solved"] < e["hard"]["effort_per_solved"]


def test_the_demonstrators_habits_are_hashed_per_task_at_their_rates(tmp_path):
    ids = [f"task-{i}" for i in range(4000)]
    par = [habits(i, 0.1, 0.6)[0] for i in ids]
    ver = [habits(i, 0.1, 0.6)[1] for i in ids]
    assert 0.08 < sum(par) / len(ids) < 0.12 and 0.57 < sum(ver) / len(ids) < 0.63
    assert [habits(i, 0.1, 0.6) for i in ids] == [habits(i, 0.1, 0.6) for i in ids]
    assert [habits(i, 0.1, 0.6, seed=1) for i in ids] != [habits(i, 0.1, 0.6) for i in ids]
    # independent of each other and of the decoy choice
    both = sum(p and v for p, v in zip(par, ver)) / len(ids)
    assert abs(both - 0.06) < 0.015
    dec = [writes_decoy(i, 0.5) for i in ids]
    assert abs(sum(d and v for d, v in zip(dec, ver)) / len(ids) - 0.3) < 0.03
    assert all(habits(i) == (True, False) for i in ids[:50])  # the defaults: the teacher as before
    sur = [surveys(i, 0.3) for i in ids]
    assert 0.27 < sum(sur) / len(ids) < 0.33 and not any(surveys(i) for i in ids[:50])
    assert abs(sum(s and v for s, v in zip(sur, ver)) / len(ids) - 0.18) < 0.02
    (path,) = [p for p in generate_tasks(6, 5, tmp_path, difficulty=0, two_file_rate=0.5) if two_file(Task.load(p))][:1]
    task = Task.load(path)
    assert len(demonstrator(parallel_rate=0.0, verify_rate=1.0)(task).plan) == 6  # 5 one-call turns + the answer
    assert len(demonstrator()(task).plan) == 3
    with pytest.raises(TaskError, match="verify_rate"):
        demonstrator(verify_rate=-0.1)
    with pytest.raises(TaskError, match="survey_rate"):
        demonstrator(survey_rate=1.5)


def test_habits_kept_to_one_file_tasks_leave_two_file_tasks_only_their_unbatched_calls(tmp_path):
    from opencomposer.tasks.demo_family import teacher_habits

    tasks = [Task.load(p) for p in generate_tasks(8, 5, tmp_path, difficulty=0, two_file_rate=0.5)]
    assert {two_file(t) for t in tasks} == {True, False}
    for task in tasks:
        everywhere = teacher_habits(task, 0.5, 1.0, 1.0, seed=3)
        assert everywhere == (habits(task.id, 0.5, 1.0, 3)[0], True, True)
        kept = teacher_habits(task, 0.5, 1.0, 1.0, seed=3, habit_tasks="one_file")
        assert kept == ((everywhere[0], False, False) if two_file(task) else everywhere)
        plan = demonstrator(parallel_rate=0.0, verify_rate=1.0, survey_rate=1.0, habit_tasks="one_file")(task).plan
        calls = [c["function"] for m in plan[:-1] for c in m["tool_calls"]]
        assert len(plan) == 5  # two-file: 4 one-call turns; one-file: a survey, the read, the edit, a re-read
        assert [c["name"] for c in calls] == (["read_file"] * 2 + ["edit_file"] * 2 if two_file(task)
                                              else ["read_file", "read_file", "edit_file", "read_file"])
        assert len(demonstrator(verify_rate=1.0, survey_rate=1.0, habit_tasks="one_file")(task).plan) == \
            (3 if two_file(task) else 5)  # batched: reads, edits, the answer
    with pytest.raises(TaskError, match="habit_tasks"):
        demonstrator(habit_tasks="two_file")


def test_the_choice_to_batch_is_untaught_on_its_share_of_two_file_demonstrations_only(tmp_path):
    from opencomposer.tasks.demo_family import teaches_choice

    ids = [f"task-{i}" for i in range(4000)]
    assert 0.17 < sum(teaches_choice(i, 0.2) for i in ids) / len(ids) < 0.23
    assert all(teaches_choice(i) for i in ids[:50])  # the default: every batching demonstration teaches it
    par = [habits(i, 0.5, 0.0)[0] for i in ids]
    both = sum(p and teaches_choice(i, 0.2) for p, i in zip(par, ids)) / len(ids)
    assert abs(both - 0.1) < 0.015  # independent of the parallel habit
    tasks = [Task.load(p) for p in generate_tasks(8, 5, tmp_path, difficulty=0, two_file_rate=0.5)]
    for task in tasks:
        plan = demonstrator(parallel_choice_rate=0.0)(task)
        assert plan.untaught_turns == ([0] if two_file(task) else [])  # one read: nothing to choose
        surveying = demonstrator(parallel_choice_rate=0.0, survey_rate=1.0)(task)  # the survey's turn comes first
        assert surveying.untaught_turns == ([1] if two_file(task) else []) and len(surveying.plan) == len(plan.plan) + 1
        assert demonstrator()(task).untaught_turns == []
        assert demonstrator(parallel_rate=0.0, parallel_choice_rate=0.0)(task).untaught_turns == []
    with pytest.raises(TaskError, match="parallel_choice_rate"):
        demonstrator(parallel_choice_rate=2.0)
