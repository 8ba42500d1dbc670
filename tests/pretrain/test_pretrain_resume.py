"""Kill a pretraining run with SIGKILL mid-run, resume it, and get the uninterrupted loss curve.

The killed process is a real `train()` in a child process that SIGKILLs itself right after
step N (no clean shutdown, no final save); `--resume` continues from the newest checkpoint.
The run is killed twice: once in the main phase and once inside the context-extension phase,
so the data cursor, optimizer state, RNG state, phase and YaRN RoPE are all restored.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pretrain_util import read_metrics, write_config

from opencomposer.pretrain.config import parse_config
from opencomposer.pretrain.train import train

CHILD = textwrap.dedent("""
    import os, signal, sys
    from opencomposer.pretrain.config import load_config
    from opencomposer.pretrain.train import train

    cfg, kill_at, resume = load_config(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"

    def on_step(step, record):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    train(cfg, resume=resume, on_step=on_step)
""")

CURVE = ("step", "phase", "loss_main", "loss_mtp", "mtp_agree", "grad_norm", "lr", "tokens",
         "eval_loss_main", "eval_loss_mtp")


def _curve(run_dir):
    return [{k: r[k] for k in CURVE if k in r} for r in read_metrics(run_dir)]


@pytest.mark.slow
def test_killed_and_resumed_run_repeats_the_uninterrupted_curve(make_config, tmp_path):
    phases = [{"name": "main", "steps": 8, "seq_len": 64, "batch_size": 8, "micro_batch_size": 4,
               "lr": 3e-3, "warmup_steps": 2},
              {"name": "extend", "steps": 4, "seq_len": 256, "batch_size": 2, "lr": 1e-3, "yarn_factor": 4}]
    base = make_config(phases=phases, checkpoint={"every_steps": 3}, eval_every=3, mtp={"mode": "distill", "start_step": 2})
    train(parse_config(base))
    reference = _curve(base["run"]["out_dir"])
    assert len([r for r in reference if "loss_main" in r]) == 12

    cfg = dict(base, run=dict(base["run"], out_dir=str(tmp_path / "killed")))
    path = write_config(cfg, tmp_path / "killed.yaml")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for kill_at, resume in ((5, "0"), (11, "1"), (0, "1")):  # checkpoints at 3 and 9; then run to the end
        proc = subprocess.run([sys.executable, str(script), str(path), str(kill_at), resume],
                              capture_output=True, text=True, timeout=300)
        if kill_at:
            assert proc.returncode == -9, proc.stderr[-2000:]
        else:
            assert proc.returncode == 0, proc.stderr[-2000:]
    assert _curve(cfg["run"]["out_dir"]) == reference
