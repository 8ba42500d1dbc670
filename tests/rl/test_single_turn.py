"""Single-turn mode: prompts and reward functions load as TRL/verifiers users write them, engine
results become correctly aligned samples, the loop learns a toy reward, and `opencomposer rl`
writes its run directory and refuses to overwrite it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.rl.config import RewardFunctionConfig, load_rl_config
from opencomposer.engine.engine import Engine
from opencomposer.engine.types import GenerationRequest, SamplingParams
from opencomposer.errors import ConfigError
from opencomposer.rl.single_turn import (Prompt, import_function, load_prompts, load_reward_functions, request_seed,
                                         run_single_turn, sample_from_result, score)

from trainer_util import tiny_model, tiny_run_config, write_tiny_model_yaml


def test_prompts_from_jsonl_keep_extra_fields_for_the_rewards(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "prompt": "1+1=", "answer": 2}\n\n{"prompt": "2+2=", "answer": 4}\n')
    prompts = load_prompts(p)
    assert [(q.id, q.text, q.fields) for q in prompts] == [("a", "1+1=", {"answer": 2}), ("1", "2+2=", {"answer": 4})]
    assert [q.id for q in load_prompts(["x", {"prompt": "y", "id": 7}])] == ["0", "7"]
    with pytest.raises(ConfigError, match=r"row 0 has no string field 'question'"):
        load_prompts([{"q": 1}], prompt_field="question")
    p.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2 is not valid JSON"):
        load_prompts(p)


def test_reward_functions_import_by_name_and_get_fields_and_kwargs():
    fns = load_reward_functions([RewardFunctionConfig(fn="opencomposer.rl.single_turn:token_range_fraction",
                                                      weight=2.0, kwargs={"lo": 10, "hi": 20}),
                                 "opencomposer.rl.single_turn:digit_fraction"])
    seen = {}

    def exact(prompt, completion, answer, **kw):  # verifiers style: dataset fields as keywords
        seen.update(kw)
        return float(completion.strip() == str(answer))

    fns += load_reward_functions([exact])
    total, parts = score(fns, Prompt("p", "1+1=", {"answer": 2}), " 2", [1, 2], [10, 15, 30, 40])
    assert parts == {"token_range_fraction": 0.5, "digit_fraction": 1.0, "exact": 1.0}
    assert total == 2 * 0.5 + 1.0 + 1.0
    assert seen["completion_ids"] == [10, 15, 30, 40] and seen["prompt_ids"] == [1, 2]


def test_bad_reward_functions_are_named():
    with pytest.raises(ConfigError, match="expected 'module:function'"):
        import_function("json.loads")
    with pytest.raises(ConfigError, match="cannot import no_such_module"):
        import_function("no_such_module:f")
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        import_function("json:nope")
    fns = load_reward_functions([lambda prompt, completion, **kw: "high"])
    with pytest.raises(ConfigError, match="returned 'high'"):
        score(fns, Prompt("p", "x"), "y", [1], [2])
    fns = load_reward_functions([lambda prompt, completion: 1.0])  # forgot **kw
    with pytest.raises(ConfigError, match=r"take \(prompt, completion, \*\*kw\)"):
        score(fns, Prompt("p", "x"), "y", [1], [2])


def test_engine_results_become_samples_with_input_position_routing():
    model = tiny_model()
    engine = Engine(model, max_slots=2, max_len=64)
    r = engine.generate_batch([GenerationRequest([1, 40, 41], SamplingParams(max_new_tokens=5, seed=3),
                                                 return_routed_experts=True, return_prompt_routed_experts=True)])[0]
    engine.stop()
    s = sample_from_result(r, 0.5, "g", "t", (2, 2))
    P, O = 3, len(r.output_ids)
    assert s.token_ids.tolist() == [1, 40, 41] + r.output_ids
    assert s.loss_mask.tolist() == [False] * P + [True] * O
    np.testing.assert_allclose(s.behav_logprobs[P:], r.logprobs)
    assert (s.behav_logprobs[:P] == 0).all() and s.policy_versions.tolist() == [-1] * P + [0] * O
    # row i = the experts of input position i: prompt rows, then output rows 1.., then −1 for the last token
    np.testing.assert_array_equal(s.routed_experts[:P], r.prompt_routed_experts)
    np.testing.assert_array_equal(s.routed_experts[P:P + O - 1], r.routed_experts[1:])
    assert (s.routed_experts[-1] == -1).all()


def test_request_seeds_depend_on_run_task_and_index_only():
    assert request_seed(0, "a", 1) == request_seed(0, "a", 1)
    assert len({request_seed(0, "a", 1), request_seed(1, "a", 1), request_seed(0, "b", 1), request_seed(0, "a", 2)}) == 4


@pytest.mark.slow
def test_the_loop_learns_a_toy_reward(tmp_path):
    """20 steps of 4 prompts × 8 completions × 16 tokens: the fraction of tokens in [1000, 1400)
    starts near its chance level 400/4096 ≈ 0.1 and climbs (about 0.9 after 20 steps)."""
    cfg = load_rl_config(data=tiny_run_config(
        tmp_path / "run", write_tiny_model_yaml(tmp_path), data={"group_size": 8, "groups_per_step": 4, "prompts": [f"p{i}" for i in range(100)]},
        train={"max_steps": 20, "optim": {"lr": 2e-2}}, checkpoint={"every_steps": 100},
        engine={"max_slots": 32}))
    rewards = []
    summary = run_single_turn(cfg, on_step=lambda step, m: rewards.append(m["reward/mean"]))
    assert summary["steps"] == 20 and len(set(summary["trained"])) == 80
    first, last = np.mean(rewards[:4]), np.mean(rewards[-4:])
    assert first < 0.2 and last > first + 0.3, rewards


def run_cli(*args):
    return CliRunner().invoke(app, ["rl", *args], catch_exceptions=False)


def test_cli_writes_the_run_directory_and_resumes(tmp_path):
    cfg = tiny_run_config(tmp_path / "run", write_tiny_model_yaml(tmp_path), train={"max_steps": 2},
                          log={"tensorboard": True, "progress": True})
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = run_cli("--config", str(path))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["trained"] == 4
    run = tmp_path / "run"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["loss"]["aggregation"] == "constant" and saved["train"]["max_steps"] == 2  # resolved, defaults in
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and "reward/mean" in lines[0] and "sync/bytes_sent" in lines[0]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000002"]

    again = CliRunner().invoke(app, ["rl", "--config", str(path)])
    assert again.exit_code == 2 and "--resume" in again.output
    more = run_cli("--config", str(path), "--resume", "--set", "train.max_steps=3")
    assert more.exit_code == 0, more.output
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    changed = CliRunner().invoke(app, ["rl", "--config", str(path), "--resume", "--set", "data.group_size=3"])
    assert changed.exit_code == 2 and "data.group_size" in changed.output


def test_cli_stops_early_on_a_bad_config(tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"model": {"config": "x.yaml"}, "data": {"prompts": ["a"], "rewards": ["m:f"]},
                                    "train": {"micro_batch_size": 0}}))
    result = CliRunner().invoke(app, ["rl", "--config", str(path)])
    assert result.exit_code == 2 and "train.micro_batch_size" in result.output
