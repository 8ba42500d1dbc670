"""The trainer: schedule, MTP objectives and their start step, checkpoints, the CLI."""

from __future__ import annotations

import math

import pytest
import torch
from pretrain_util import read_metrics, write_config
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.errors import ConfigError
from opencomposer.model import ModelConfig, Transformer, load_pretrained
from opencomposer.model.tokenizer import Tokenizer
from opencomposer.pretrain.checkpoint import latest_checkpoint
from opencomposer.pretrain.config import PhaseConfig, parse_config
from opencomposer.pretrain.train import lr_at, train


def test_lr_warms_up_then_decays_to_the_floor():
    p = PhaseConfig(name="p", steps=100, seq_len=8, batch_size=1, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(p, 0) == pytest.approx(0.1) and lr_at(p, 9) == pytest.approx(1.0)
    assert lr_at(p, 10) == pytest.approx(1.0) and lr_at(p, 99) == pytest.approx(0.1)
    assert lr_at(p, 10 + 89 // 2) == pytest.approx(0.55, abs=0.02)
    assert all(lr_at(p, s) >= lr_at(p, s + 1) for s in range(10, 99))


def _mean(xs):
    return sum(xs) / len(xs)


# "ce" is a cross-entropy on the token after next (starts near ln 4096 = 8.3 nats and falls like the
# main loss); "distill" is a KL to the main head (starts small, since both heads begin near uniform,
# and shrinks by a factor as the MTP head learns to copy the main one).
@pytest.mark.parametrize("mode,fell", [("ce", lambda first, last: last < first - 0.4),
                                       ("distill", lambda first, last: last < 0.8 * first)])
def test_mtp_and_main_losses_fall(make_config, mode, fell):
    phases = [{"name": "main", "steps": 24, "seq_len": 64, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2}]
    cfg = parse_config(make_config(phases=phases, mtp={"mode": mode, "start_step": 6}, checkpoint={"every_steps": 100}))
    train(cfg)
    rows = [r for r in read_metrics(cfg.run.out_dir) if "loss_main" in r]
    assert [r["mtp_on"] for r in rows] == [False] * 6 + [True] * 18
    assert all(r["loss_mtp"] == 0 for r in rows[:6])
    mtp = [r["loss_mtp"] for r in rows[6:]]
    assert fell(_mean(mtp[:4]), _mean(mtp[-4:])), mtp
    assert _mean([r["loss_main"] for r in rows[-4:]]) < _mean([r["loss_main"] for r in rows[:4]]) - 0.3


def test_bfloat16_autocast_trains_the_moe_model_close_to_float32(make_config, tmp_path):
    """dtype bfloat16 (configs/pretrain/gpu_small.yaml's): the routed experts' grouped backward used to
    meet bfloat16 gradients with float32 weights and stop. Now the run finishes, its weights stay
    float32, and its losses follow float32's within bfloat16's rounding."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        cfg = parse_config(make_config(dtype=dtype, run={"out_dir": str(tmp_path / dtype), "seed": 0, "num_threads": 1}))
        train(cfg)
        losses[dtype] = [r["loss_main"] for r in read_metrics(cfg.run.out_dir) if "loss_main" in r]
        model = load_pretrained(f"{cfg.run.out_dir}/checkpoints/step_0000008/model")
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert len(losses["bfloat16"]) == len(losses["float32"]) == 8
    assert losses["bfloat16"] != losses["float32"]  # the matmuls did run in bfloat16
    assert losses["bfloat16"] == pytest.approx(losses["float32"], abs=0.05), losses


def test_mtp_modules_are_untouched_before_start_step(make_config, tmp_path):
    cfg = parse_config(make_config(mtp={"mode": "distill", "start_step": 4}, checkpoint={"every_steps": 4,
                                                                                       "keep_last": 5}))
    train(cfg)
    torch.manual_seed(0)
    init = Transformer(ModelConfig.from_dict(cfg.model_dict())).state_dict()
    at4 = load_pretrained(f"{cfg.run.out_dir}/checkpoints/step_0000004/model").state_dict()
    at8 = load_pretrained(f"{cfg.run.out_dir}/checkpoints/step_0000008/model").state_dict()
    mtp_keys = [k for k in init if k.startswith("mtp.")]
    assert mtp_keys and all(torch.equal(init[k], at4[k]) for k in mtp_keys)
    assert not torch.equal(init["layers.0.self_attn.q_proj.weight"], at4["layers.0.self_attn.q_proj.weight"])
    assert any(not torch.equal(at4[k], at8[k]) for k in mtp_keys)


def test_checkpoints_are_servable_and_pruned(make_config):
    cfg = parse_config(make_config(checkpoint={"every_steps": 2, "keep_last": 2}))
    summary = train(cfg)
    ckpts = sorted(p.name for p in (latest_checkpoint(cfg.run.out_dir).parent).iterdir())
    assert ckpts == ["step_0000006", "step_0000008"]
    model = load_pretrained(summary["model_dir"])
    assert Tokenizer.load(summary["model_dir"]).vocab_size == model.config.vocab_size
    assert math.isfinite(summary["eval_loss_main"])
    ids = torch.randint(0, 4096, (1, 16))
    assert model(ids).logits.shape == (1, 16, 4096)
    with pytest.raises(ConfigError, match="pass --resume"):
        train(cfg)
    assert train(cfg, resume=True)["steps"] == 8  # already finished: nothing to do


def test_cli_reports_bad_config_fields(make_config, tmp_path):
    cfg = make_config()
    cfg["mtp"]["mod"] = "ce"
    result = CliRunner().invoke(app, ["pretrain", "--config", str(write_config(cfg, tmp_path / "c.yaml"))])
    assert result.exit_code == 1
    assert "mtp.mod: unknown key" in result.output
