"""SFT: oracle trajectories collected through the real harness render with exactly RL's tokens and
loss mask, the masked loss goes down on them, and a killed run resumes to the same result."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from opencomposer.errors import ConfigError
from opencomposer.harness.agent import Agent
from opencomposer.harness.trajectory import read_jsonl
from opencomposer.model import ModelConfig, Transformer, load_pretrained, save_pretrained
from opencomposer.model.chat import encode_turn
from opencomposer.model.tokenizer import ASSISTANT, END, bundled_tokenizer
from opencomposer.pretrain.sft import Examples, load_config, render, train_sft
from opencomposer.sandbox import get_backend
from opencomposer.tasks.build import task_image
from opencomposer.tasks.demo_family import DEMO_AGENT, generate_tasks, writes_decoy
from opencomposer.tasks.demonstrations import collect_trajectories
from opencomposer.tasks.grade import grade
from opencomposer.tasks.policies import ScriptedTokenPolicy
from opencomposer.tasks.task import Suite, Task

SMALL_MODEL = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 1024,
               "num_mtp_modules": 1}


@pytest.fixture(scope="module")
def backend():
    return get_backend("bwrap")


@pytest.fixture(scope="module")
def collected(tmp_path_factory, backend) -> tuple[Path, Path]:
    """(suite dir, trajectories.jsonl): the read-edit oracle on 4 demo tasks, graded."""
    root = tmp_path_factory.mktemp("sft")
    generate_tasks(4, 5, root / "suite", difficulty=1)
    out = root / "oracle.jsonl"
    asyncio.run(collect_trajectories(root / "suite", out, DEMO_AGENT, grade=True, backend=backend))
    return root / "suite", out


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base") / "model"
    save_pretrained(Transformer(ModelConfig.from_dict(SMALL_MODEL)), path)
    bundled_tokenizer().save(path)
    return path


def config(tmp_path: Path, base: Path, trajectories: Path, lr: float = 3e-3, checkpoint_every: int = 4,
           **over) -> Path:
    cfg = {"run": {"out_dir": str(tmp_path / "run"), "seed": 0, "num_threads": 1}, "init_from": str(base),
           "steps": 8, "batch_size": 2, "optim": {"lr": lr, "warmup_steps": 2},
           "checkpoint": {"every_steps": checkpoint_every}, "eval_every": 4, "log": {"every_steps": 100},
           "data": {"trajectories": [str(trajectories)], "val_examples": 0, "cache_dir": str(tmp_path / "cache")}}
    cfg.update(over)
    path = tmp_path / "sft.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_collection_resolves_every_task_and_resumes(collected, backend):
    suite, out = collected
    trajs = read_jsonl(out)
    assert sorted(t.task_id for t in trajs) == sorted(t.id for t in Suite.load(suite).tasks)
    assert all(t.reward == 1.0 and t.stop_reason == "final" for t in trajs)
    again = asyncio.run(collect_trajectories(suite, out, DEMO_AGENT, backend=backend))  # nothing left to do
    assert len(again) == len(trajs)
    # the file is in the suite's order, whatever order the tasks finished in (SFT's shuffle starts from it)
    ids = [t.id for t in Suite.load(suite).tasks]
    assert [t.task_id for t in trajs] == ids
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(reversed(lines)))  # what a crash and a resume can leave: finished out of order
    again = asyncio.run(collect_trajectories(suite, out, DEMO_AGENT, backend=backend))
    assert [t.task_id for t in again] == ids and out.read_text() == "".join(lines)


def test_suite_order_keeps_lines_whose_text_holds_other_line_breaks(tmp_path):
    from opencomposer.tasks.demonstrations import _in_suite_order

    path = tmp_path / "t.jsonl"
    b, a = (json.dumps({"task_id": t, "final_message": "x\u2028y\x85z"}, ensure_ascii=False) + "\n" for t in "ba")
    path.write_text(b + a + '{"task_id": "c", "cut')  # the last line cut by a crash mid-write
    _in_suite_order(path, ["a", "b"])
    assert path.read_text() == a + b


def test_loss_mask_covers_exactly_the_assistant_tokens(collected):
    tok = bundled_tokenizer()
    traj = read_jsonl(collected[1])[0]
    ((ids, mask),) = render(traj, tok)
    assistant, end = tok.special_id(ASSISTANT), tok.special_id(END)
    expected, inside = [], False
    for t in ids:  # 1 from after <|assistant|> up to and including its <|im_end|>
        expected.append(int(inside))
        if t == assistant:
            inside = True
        elif t == end:
            inside = False
    assert mask == expected
    turns = [m for m in traj.segments[0].messages if m["role"] == "assistant"]
    assert sum(mask) == sum(len(encode_turn(tok, m)) - 1 for m in turns)


def test_rendering_equals_the_token_level_record_of_the_same_episode(collected, backend):
    """What SFT trains on is what RL's agent loop records when a model writes the same turns."""
    tok = bundled_tokenizer()
    suite, out = collected
    chat = read_jsonl(out)[0]
    task = next(t for t in Suite.load(suite).tasks if t.id == chat.task_id)
    turns = [encode_turn(tok, m)[1:] for m in chat.segments[0].messages if m["role"] == "assistant"]
    ws = task_image(task, backend).workspace()
    try:
        token = asyncio.run(Agent(ScriptedTokenPolicy(tok, turns), ws, DEMO_AGENT).run(task.spec.instruction))
    finally:
        ws.close()
    ((ids, mask),) = render(chat, tok)
    assert token.segments[0].token_ids == ids
    assert token.segments[0].loss_mask == mask


@pytest.mark.slow
def test_sft_lowers_the_masked_loss_and_publishes_a_servable_model(tmp_path, collected, base_model):
    cfg = load_config(config(tmp_path, base_model, collected[1], steps=20, lr=1e-2, checkpoint_every=20,
                                    eval_every=20))
    summary = train_sft(cfg)
    losses = [json.loads(line)["loss_main"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if "loss_main" in json.loads(line)]
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:3]) / 3
    model_dir = Path(summary["model_dir"])
    assert (model_dir / "tokenizer.json").is_file()
    assert load_pretrained(model_dir).config.num_mtp_modules == 1
    assert summary["data"]["examples"] == 4 and summary["data"]["assistant_tokens"] > 0


def test_bfloat16_sft_follows_float32_and_keeps_float32_weights(tmp_path, collected, base_model):
    """dtype bfloat16: the packed forward (segment attention, grouped experts, MTP) under autocast,
    float32 weights and optimizer; its losses follow float32's within bfloat16's rounding."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        cfg = load_config(config(tmp_path / dtype, base_model, collected[1], steps=6, checkpoint_every=6, dtype=dtype))
        summary = train_sft(cfg)
        losses[dtype] = [json.loads(line)["loss_main"] for line in
                         (tmp_path / dtype / "run" / "metrics.jsonl").read_text().splitlines() if "loss_main" in line]
        model = load_pretrained(Path(summary["model_dir"]))
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert len(losses["bfloat16"]) == 6 and losses["bfloat16"] != losses["float32"]
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.03), losses


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, collected, base_model):
    full = load_config(config(tmp_path / "a", base_model, collected[1]))
    train_sft(full)

    class Killed(Exception):
        pass

    def kill(step, record):
        if step == 6:  # after the checkpoint at step 4: steps 5-6 are lost and redone
            raise Killed

    cut = load_config(config(tmp_path / "b", base_model, collected[1]))
    with pytest.raises(Killed):
        train_sft(cut, on_step=kill)
    with pytest.raises(ConfigError, match="--resume"):
        train_sft(cut)
    train_sft(cut, resume=True)

    def curve(run):
        return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert curve(tmp_path / "a" / "run") == curve(tmp_path / "b" / "run")
    a, b = load_pretrained(tmp_path / "a" / "run" / "model"), load_pretrained(tmp_path / "b" / "run" / "model")
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_rendered_examples_are_cached(tmp_path, collected):
    tok = bundled_tokenizer()
    first = Examples.build([collected[1]], tok, 1024, tmp_path)
    assert len(list(tmp_path.glob("sft-*.npz"))) == 1
    second = Examples.build([collected[1]], tok, 1024, tmp_path)
    assert (first.ids == second.ids).all() and (first.mask == second.mask).all() and first.meta == second.meta
    with pytest.raises(ConfigError, match="max_len"):
        Examples.build([collected[1]], tok, 100, tmp_path)  # every example is longer


def test_config_without_data_is_refused(tmp_path, base_model):
    cfg = load_config(config(tmp_path, base_model, tmp_path / "x.jsonl", data={}))
    with pytest.raises(ConfigError, match="no SFT data"):
        train_sft(cfg)


@pytest.mark.parametrize("with_mtp", [False, True])
def test_a_batch_sharing_its_system_turn_gives_the_unpacked_loss_and_gradients(collected, base_model, with_mtp):
    """sft_loss with the examples' lengths runs the common prefix once (training/packing.py); loss and
    gradients are those of the plain padded forward."""
    from opencomposer.pretrain.config import MTPConfig
    from opencomposer.pretrain.sft import collate, sft_loss

    tok = bundled_tokenizer()
    examples = [tuple(map(torch.tensor, render(t, tok)[0])) for t in read_jsonl(collected[1])]
    examples = [(i.numpy(), m.numpy()) for i, m in examples]
    ids, mask = collate(examples, 0)
    mtp = MTPConfig(mode="distill", weight=0.3) if with_mtp else None
    got = {}
    for lengths in (None, [len(i) for i, _ in examples]):
        model = load_pretrained(base_model)
        loss, stats = sft_loss(model, ids, mask, mtp, lengths)
        loss.backward()
        got[lengths is None] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (l0, g0), (l1, g1) = got[True], got[False]
    assert l1 == pytest.approx(l0, rel=1e-5)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_imperfect_demonstrator_writes_its_decoys_and_a_resume_keeps_it(tmp_path, base_model, backend):
    suite = tmp_path / "suite"
    generate_tasks(6, 2, suite, difficulty=0)
    data = {"suite": str(suite), "decoy_rate": 0.5, "val_examples": 0, "cache_dir": str(tmp_path / "cache")}
    cfg = load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1, data=data))
    summary = train_sft(cfg)
    trajs = read_jsonl(tmp_path / "run" / "sft_data" / "trajectories.jsonl")
    decoys = {t.task_id for t in trajs if t.meta["decoy"]}
    assert decoys == {t.task_id for t in trajs if writes_decoy(t.task_id, 0.5)} and 0 < len(decoys) < 6
    for t in trajs:  # a decoy trajectory has the gold one's shape, with another fix
        assert [r.name for r in t.tool_calls] == ["read_file", "edit_file"] and t.stop_reason == "final"
    graded = [grade(Task.load(suite / t.task_id), t.patch, backend=backend).resolved for t in trajs]
    assert [not g for g in graded] == [t.task_id in decoys for t in trajs]
    assert summary["data"]["examples"] == 6  # ungraded: every demonstration is trained on
    with pytest.raises(ConfigError, match="decoy_rate"):
        train_sft(load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1,
                                     data={**data, "decoy_rate": 0.0})), resume=True)


def collect_on_the_mix(tmp_path: Path, base_model: Path, n: int, two_file_rate: float, **habits) -> tuple:
    """One SFT step on `n` demo tasks (two_file_rate of them two-file) collected by the demonstrator
    with these habits (data.* fields): (suite, the data section, the collected trajectories)."""
    from opencomposer.pipeline import demo_agent

    suite = tmp_path / "suite"
    generate_tasks(n, 5, suite, difficulty=0, two_file_rate=two_file_rate)
    data = {"suite": str(suite), **habits, "val_examples": 0,
            "agent": demo_agent(max_turns=7).model_dump(mode="json"), "cache_dir": str(tmp_path / "cache")}
    train_sft(load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1, data=data)))
    return suite, data, read_jsonl(tmp_path / "run" / "sft_data" / "trajectories.jsonl")


def test_the_demonstrators_habits_shape_its_episodes_and_a_resume_keeps_them(tmp_path, base_model, backend):
    from opencomposer.tasks.demo_family import habits, surveys, two_file

    suite, data, trajs = collect_on_the_mix(tmp_path, base_model, 6, 0.5, parallel_rate=0.5, verify_rate=0.5,
                                            survey_rate=0.5)
    assert len(trajs) == 6 and any(two_file(Task.load(suite / t.task_id)) for t in trajs)
    assert 0 < sum(surveys(t.task_id, 0.5) for t in trajs) < 6
    for t in trajs:
        parallel, verify = habits(t.task_id, 0.5, 0.5)
        survey = surveys(t.task_id, 0.5)
        files = 1 + two_file(Task.load(suite / t.task_id))
        assert (t.meta["parallel"], t.meta["verify"], t.meta.get("survey", False)) == (parallel, verify, survey)
        assert t.stop_reason == "final" and t.counts.turns == (2 if parallel else 2 * files) + verify + survey + 1
        first = json.loads(t.messages[2]["tool_calls"][0]["function"]["arguments"])["path"]
        assert (first == f"{Task.load(suite / t.task_id).spec.source.package}/__init__.py") == survey
        assert grade(Task.load(suite / t.task_id), t.patch, backend=backend).resolved
    for field, other in (("verify_rate", 0.0), ("survey_rate", 0.0)):
        with pytest.raises(ConfigError, match=field):
            train_sft(load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1,
                                         data={**data, field: other})), resume=True)


def test_habits_kept_to_one_file_tasks_are_collected_so_and_a_resume_keeps_the_scope(tmp_path, base_model):
    from opencomposer.tasks.demo_family import two_file

    suite, data, trajs = collect_on_the_mix(tmp_path, base_model, 6, 0.5, parallel_rate=0.0, verify_rate=1.0,
                                            survey_rate=1.0, habit_tasks="one_file")
    kinds = [two_file(Task.load(suite / t.task_id)) for t in trajs]
    assert len(trajs) == 6 and True in kinds and False in kinds
    for t, two in zip(trajs, kinds):  # two-file: 2 reads, 2 edits; one-file: survey, read, edit, re-read
        assert (t.meta["verify"], t.meta.get("survey", False)) == (not two, not two)
        assert t.stop_reason == "final" and t.counts.turns == 5
    with pytest.raises(ConfigError, match="habit_tasks"):
        train_sft(load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1,
                                     data={**data, "habit_tasks": "all"})), resume=True)


def test_untaught_first_turns_are_left_out_of_the_loss_and_a_resume_keeps_the_rate(tmp_path, base_model):
    from opencomposer.tasks.demo_family import teaches_choice, two_file

    suite, data, trajs = collect_on_the_mix(tmp_path, base_model, 8, 1.0, parallel_rate=1.0, parallel_choice_rate=0.5,
                                            survey_rate=0.7)
    tok = bundled_tokenizer()
    taught = [teaches_choice(t.task_id, 0.5) for t in trajs]
    assert all(two_file(Task.load(suite / t.task_id)) for t in trajs) and 0 < sum(taught) < len(trajs)
    untaught = [t.meta.get("survey", False) for t, keep in zip(trajs, taught) if not keep]
    assert True in untaught and False in untaught  # both places of the untaught turn occur
    for t, keep in zip(trajs, taught):
        survey = t.meta.get("survey", False)  # the survey's turn comes first, and is taught
        assert t.meta.get("untaught_turns", []) == ([] if keep else [int(survey)])
        (ids, mask), = render(t, tok)
        whole = copy.deepcopy(t)
        whole.meta.pop("untaught_turns", None)
        (full_ids, full_mask), = render(whole, tok)
        assert ids == full_ids and all(m <= f for m, f in zip(mask, full_mask))
        dropped = tok.decode([i for i, m, f in zip(ids, mask, full_mask) if f and not m])
        if keep:
            assert mask == full_mask
        else:  # exactly the batched reads' turn: both reads, none of the edits or the answer
            assert dropped.count("read_file") == 2 and "edit_file" not in dropped and "Done." not in dropped
            kept = tok.decode([i for i, m in zip(ids, mask) if m])
            assert kept.count("edit_file") == 2 and kept.count("read_file") == survey and "Done." in kept
    with pytest.raises(ConfigError, match="parallel_choice_rate"):
        train_sft(load_config(config(tmp_path, base_model, tmp_path / "unused", steps=1,
                                     data={**data, "parallel_choice_rate": 1.0})), resume=True)
