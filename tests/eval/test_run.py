"""`opencomposer eval`: the oracle resolves every smoke task, the no-op none; resume, errors
that are retried on rerun, and bad policy specs."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.errors import ConfigError
from opencomposer.eval import run as run_mod
from opencomposer.eval.results import read_rows
from opencomposer.eval.run import EvalOptions, evaluate
from opencomposer.harness.trajectory import Trajectory, read_jsonl
from opencomposer.tasks.policies import ScriptedPolicy
from opencomposer.tasks.task import Suite

SMOKE = Path(__file__).resolve().parents[2] / "tasks" / "suites" / "smoke"
TWO = "dates*,grades*"


def eval_cli(*args):
    result = CliRunner().invoke(app, ["eval", "--suite", str(SMOKE), "--no-progress", *map(str, args)])
    return result


def test_eval_oracle_resolves_and_noop_does_not(tmp_path):
    r = eval_cli("--policy", "oracle", "--out", tmp_path / "oracle", "--tasks", TWO, "--concurrency", "2")
    assert r.exit_code == 0, r.output
    assert "accuracy 1.000" in r.output
    res = json.loads((tmp_path / "oracle" / "results.json").read_text())
    assert res["summary"]["accuracy"] == 1.0 and res["summary"]["episodes"] == 2 and res["summary"]["errors"] == 0
    gold = {t.id: t.gold_patch for t in Suite.load(SMOKE).tasks}
    trajs = read_jsonl(tmp_path / "oracle" / "trajectories.jsonl")
    assert sorted(t.task_id for t in trajs) == ["dates-is_leap-remove-body", "grades-median-remove-body"]
    for t in trajs:
        assert t.reward == 1.0 and t.grade["resolved"] and t.patch == gold[t.task_id]
        assert t.stop_reason == "final" and t.meta["pass"] == 0
    assert not list((tmp_path / "oracle" / "partial").glob("*.json"))  # finished episodes leave no partial file

    r = eval_cli("--policy", "noop", "--out", tmp_path / "noop", "--tasks", TWO, "--passes", "2")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "noop" / "results.json").read_text())["summary"]
    assert s["accuracy"] == 0.0 and s["episodes"] == 4 and s["pass_at_k"] == {"1": 0.0, "2": 0.0}
    assert all(row["patch_lines"] == 0 and row["grade_reason"] is None for row in read_rows_dicts(tmp_path / "noop"))


def read_rows_dicts(out):
    return [r.__dict__ for r in read_rows(out)]


@pytest.mark.slow
def test_eval_on_the_whole_smoke_suite_oracle_100_noop_0(tmp_path):
    n = len(Suite.load(SMOKE).tasks)
    for policy, accuracy in (("oracle", 1.0), ("noop", 0.0)):
        r = eval_cli("--policy", policy, "--out", tmp_path / policy, "--concurrency", "2")
        assert r.exit_code == 0, r.output
        s = json.loads((tmp_path / policy / "results.json").read_text())["summary"]
        assert (s["accuracy"], s["episodes"], s["errors"]) == (accuracy, n, 0)


async def test_rerun_skips_finished_episodes_and_runs_new_passes(tmp_path):
    opts = EvalOptions(suite=str(SMOKE), policy="oracle", tasks=["dates*"])
    await evaluate(opts, tmp_path, progress=False)
    await evaluate(opts, tmp_path, progress=False)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1
    res = await evaluate(opts.model_copy(update={"passes": 2}), tmp_path, progress=False)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
    assert res["summary"]["episodes"] == 2 and res["summary"]["pass_at_k"] == {"1": 1.0, "2": 1.0}


async def test_a_failing_policy_is_an_error_row_retried_on_rerun(tmp_path, monkeypatch):
    opts = EvalOptions(suite=str(SMOKE), policy="oracle", tasks=["dates*"])
    failing = ScriptedPolicy([ConnectionError("endpoint down")])
    with monkeypatch.context() as m:
        m.setattr(run_mod, "parse_policy", lambda spec, options, run_dir: lambda task: failing)
        res = await evaluate(opts, tmp_path, progress=False)
    row = res["rows"][0]
    assert row["status"] == "error" and "endpoint down" in row["error"] and not row["resolved"]
    assert res["summary"]["errors"] == 1 and res["summary"]["accuracy"] == 0.0
    partial = Trajectory.load(tmp_path / "partial" / "dates-is_leap-remove-body__p0.json")
    assert partial.stop_reason == "error"
    res = await evaluate(opts, tmp_path, progress=False)  # the real oracle this time
    assert res["rows"][0]["status"] == "done" and res["summary"]["accuracy"] == 1.0
    assert not (tmp_path / "partial" / "dates-is_leap-remove-body__p0.json").exists()


def test_bad_specs_and_a_different_run_in_the_same_dir_are_refused(tmp_path):
    r = eval_cli("--policy", "gpt4", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "unknown policy spec" in r.output
    r = eval_cli("--policy", "engine:/nonexistent/ckpt", "--out", tmp_path / "y")
    assert r.exit_code == 2 and "/nonexistent/ckpt" in r.output
    assert eval_cli("--policy", "noop", "--out", tmp_path / "z", "--tasks", "dates*").exit_code == 0
    r = eval_cli("--policy", "oracle", "--out", tmp_path / "z", "--tasks", "dates*")
    assert r.exit_code == 2 and "already holds a run" in r.output
    r = eval_cli("--policy", "noop", "--out", tmp_path / "w", "--tasks", "nothing-matches*")
    assert r.exit_code == 2 and "no task" in r.output


def test_endpoint_specs_build_clients_with_model_url_and_prices(monkeypatch):
    from opencomposer.harness.agent import ChatClientPolicy, TokenClientPolicy
    from opencomposer.tasks.policies import NoOpPolicy, OraclePolicy

    monkeypatch.setenv("MY_KEY", "sk-test")
    opts = EvalOptions(suite=str(SMOKE), policy="x", input_price_per_m=3.0, output_price_per_m=15.0, api_key_env="MY_KEY")
    task = Suite.load(SMOKE).tasks[0]
    chat = run_mod.parse_policy("openai:gpt-test@https://api.example.com/v1", opts)(task)
    assert isinstance(chat, ChatClientPolicy) and chat.name == "gpt-test" and not chat.send_thinking
    assert chat.client.base_url == "https://api.example.com/v1" and chat.client.model == "gpt-test"
    assert (chat.prices.input_per_mtok, chat.prices.output_per_mtok) == (3.0, 15.0)
    tokens = run_mod.parse_policy("sglang:http://127.0.0.1:30000", opts)(task)
    assert isinstance(tokens, TokenClientPolicy) and tokens.client.base_url == "http://127.0.0.1:30000"
    assert tokens.tokenizer.special_id("<|im_end|>") == 3
    assert isinstance(run_mod.parse_policy("oracle:tests", opts)(task), OraclePolicy)
    assert isinstance(run_mod.parse_policy("noop", opts)(task), NoOpPolicy)
    vllm = run_mod.parse_policy("vllm:my-model@http://127.0.0.1:8000", opts)(task)
    assert isinstance(vllm, TokenClientPolicy) and vllm.name == "my-model"
    for bad in ("oracle:x", "noop:x", "openai:no-url", "sglang:", "vllm:", "engine:", "nonsense"):
        with pytest.raises(ConfigError, match="unknown policy spec"):
            run_mod.parse_policy(bad, opts)
    with pytest.raises(ConfigError, match=r"write vllm:CKPT_DIR \(a checkpoint directory; no-url is not one\) or vllm:MODEL@BASE_URL"):
        run_mod.parse_policy("vllm:no-url", opts)


def test_eval_with_the_embedded_engine_on_a_tiny_random_checkpoint(tmp_path):
    import torch

    from opencomposer.model import ModelConfig, Transformer, save_pretrained

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                      num_experts_per_tok=2, max_position_embeddings=8192)
    save_pretrained(Transformer(cfg).eval(), tmp_path / "ckpt")
    (tmp_path / "agent.yaml").write_text("max_turns: 2\nmax_new_tokens: 8\ntemperature: 0\n")  # greedy: deterministic
    r = eval_cli("--policy", f"engine:{tmp_path / 'ckpt'}", "--out", tmp_path / "run", "--tasks", "dates*",
                 "--agent-config", tmp_path / "agent.yaml")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    row = res["rows"][0]
    assert row["status"] == "done" and not row["resolved"] and row["turns"] == 2 and row["stop_reason"] == "max_turns"
    t = read_jsonl(tmp_path / "run" / "trajectories.jsonl")[0]
    seg = t.segments[0]
    assert t.token_level and sum(seg.loss_mask) == 16  # two turns of 8 sampled tokens, kept verbatim
    assert all(lp < 0 for lp, m in zip(seg.logprobs, seg.loss_mask) if m)
