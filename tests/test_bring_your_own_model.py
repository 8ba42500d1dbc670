"""A tiny random Qwen3-MoE with the real Qwen vocabulary (`opencomposer model new --vocab qwen`) goes
through oracle SFT on the smoke suite, two steps of agentic RL and `opencomposer eval`, through the real
sandbox, tools and grader, each a CLI command as a user runs it; every checkpoint on the way carries its
serving files, the eval's recorded token ids and logprobs are the model's own (recomputed), and the chat
server renders the episode's prompt to the same ids.

One run per chat format of the registry (model/chat.py): Qwen3's own tokens at their own ids for qwen3
and qwen3_coder, opencomposer's structure tokens appended to the vocabulary for opencomposer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.model import load_pretrained
from opencomposer.model.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tasks" / "suites" / "smoke"
SERVING_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "opencomposer.json")

pytestmark = pytest.mark.slow


def cli(*args) -> str:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output[-3000:]
    return r.output


def serving_files(model_dir: Path, fmt: str) -> None:
    for name in SERVING_FILES:
        assert (model_dir / name).is_file(), (model_dir, name)
    assert json.loads((model_dir / "opencomposer.json").read_text())["chat_format"] == fmt


@pytest.mark.parametrize("fmt", ["qwen3", "qwen3_coder", "opencomposer"])
def test_a_qwen_vocabulary_moe_runs_sft_rl_and_eval(fmt, tmp_path):
    base = tmp_path / "base"
    cli("model", "new", "--arch", "qwen3_moe", "--vocab", "qwen", "--format", fmt, "--out", base)
    serving_files(base, fmt)

    sft = {"run": {"out_dir": str(tmp_path / "sft"), "seed": 0, "num_threads": 2}, "init_from": str(base),
           "data": {"suite": str(SMOKE), "val_examples": 0, "max_len": 4096, "cache_dir": str(tmp_path / "cache")},
           "steps": 2, "batch_size": 2, "mtp": None, "checkpoint": {"every_steps": 2}, "eval_every": 2}
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(sft))
    cli("sft", "--config", tmp_path / "sft.yaml")
    serving_files(tmp_path / "sft" / "model", fmt)

    rl = {"mode": "agentic", "run": {"out_dir": str(tmp_path / "rl"), "seed": 0, "num_threads": 2},
          "model": {"path": str(tmp_path / "sft" / "model")}, "engine": {"max_slots": 8, "max_len": 4096},
          "sampling": {"temperature": 1.0, "max_new_tokens": 16},
          "train": {"max_steps": 2, "micro_batch_size": 4, "optim": {"lr": 1e-4}},
          "checkpoint": {"every_steps": 1}, "log": {"tensorboard": False},
          "agentic": {"suite": str(SMOKE), "runner": "local", "groups_per_step": 2, "rollout_workers": 2,
                      "max_staleness": 0, "staleness_policy": "wait",
                      "rollout": {"group_size": 2, "task_timeout_s": 120,
                                  "agent": {"max_turns": 2, "summarize_at": None,
                                            "tools": ["read_file", "edit_file", "run_terminal_cmd"]}}}}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(rl))
    cli("rl", "--config", tmp_path / "rl.yaml")
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    policy = sorted((tmp_path / "rl" / "checkpoints").glob("step_*"))[-1] / "model"
    serving_files(policy, fmt)

    (tmp_path / "agent.yaml").write_text("max_turns: 2\nmax_new_tokens: 8\ntemperature: 0\n")
    cli("eval", "--suite", SMOKE, "--policy", f"engine:{policy}", "--out", tmp_path / "eval", "--tasks", "dates*",
        "--agent-config", tmp_path / "agent.yaml", "--no-progress")
    row = json.loads((tmp_path / "eval" / "results.json").read_text())["rows"][0]
    assert row["status"] == "done" and row["resolved"] is not None  # graded in a clean fork
    from opencomposer.harness.trajectory import read_jsonl

    seg = read_jsonl(tmp_path / "eval" / "trajectories.jsonl")[0].segments[0]
    model, tok = load_pretrained(policy), load_tokenizer(checkpoint=policy)
    assert tok.chat_format == fmt and max(seg.token_ids) < model.config.vocab_size
    with torch.no_grad():  # the recorded ids and logprobs are the model's own: recompute them
        logp = torch.log_softmax(model(torch.tensor([seg.token_ids])).logits[0].float(), -1)
    gen = [i for i, m in enumerate(seg.loss_mask) if m and seg.logprobs[i] != 0.0]  # sampled, not appended
    assert len(gen) >= 8
    recomputed = [float(logp[i - 1, seg.token_ids[i]]) for i in gen]
    assert recomputed == pytest.approx([seg.logprobs[i] for i in gen], abs=1e-4)
    assert_the_chat_server_renders_them_unchanged(policy, read_jsonl(tmp_path / "eval" / "trajectories.jsonl")[0])


def assert_the_chat_server_renders_them_unchanged(ckpt: Path, traj) -> None:
    """opencomposer's chat endpoint (engine/server.py, in process) given the episode's messages up to
    its first assistant turn (system, tools, task) builds, as its prompt, exactly the ids the episode
    had there. Later turns re-render the model's replies from their text, which gives its ids back
    only where they are the text's canonical encoding (docs/chat-formats.md, "Exactness limits"); a
    random model's often are not, and RL never re-renders a generated turn."""
    import asyncio

    import httpx

    from opencomposer.engine.fake import FakeEngine
    from opencomposer.engine.server import create_app

    tok = load_tokenizer(checkpoint=ckpt)
    app = create_app(FakeEngine(vocab_size=tok.vocab_size, max_len=8192), tok, max_len=8192,
                     vocab_size=tok.vocab_size, model_name="policy")
    seg = traj.segments[0]
    starts = [i for i in range(1, len(seg.loss_mask)) if seg.loss_mask[i] and not seg.loss_mask[i - 1]]
    turns = [k for k, m in enumerate(seg.messages) if m["role"] == "assistant"]
    assert turns and len(starts) == len(turns), (starts, turns)

    async def prompts() -> list[list[int]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            out = []
            for k in turns[:1]:
                r = await c.post("/v1/chat/completions", json={
                    "model": "policy", "messages": seg.messages[:k], "tools": traj.tools, "max_tokens": 1,
                    "return_token_ids": True})
                assert r.status_code == 200, r.text
                out.append(r.json()["prompt_token_ids"])
            return out

    first = asyncio.run(prompts())[0]
    assert first == seg.token_ids[:starts[0]]
