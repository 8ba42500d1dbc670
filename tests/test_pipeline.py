"""`make demo`'s pipeline at a miniature size: every stage runs and leaves its artifacts, the
report holds the figures, held-out tasks are disjoint from training tasks, and a rerun skips
finished stages; the same with the RL stage on a local Ray instance; the one-GPU and cluster
sizings validate (they cannot run here: no GPU)."""

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from opencomposer.pipeline import Pipeline, load_config
from opencomposer.tasks.demo_family import writes_decoy

MINI = [
    "tokenizer.vocab_size=512", "tokenizer.code_bytes=300000", "tokenizer.family_samples=20",
    "pretrain.steps=3", "pretrain.batch_size=2", "pretrain.seq_len=64", "pretrain.code_bytes=1500000",
    "pretrain.model.hidden_size=64", "pretrain.model.head_dim=16", "pretrain.model.num_hidden_layers=2",
    "tasks.n_train=8", "tasks.n_heldout=3", "tasks.n_rl=6",
    "sft.steps=2", "sft.batch_size=2", "sft.warmup_steps=0",
    "eval.concurrency=3",
    "rl.steps=2", "rl.group_size=2", "rl.groups_per_step=2", "rl.micro_batch_size=4",
]


def _noting_threads(name, stage):
    def run(self):
        self.seen[name] = torch.get_num_threads()
        return stage(self)
    return run


class ThreadsSeen(Pipeline):
    """The pipeline, noting torch's thread count as the training and RL stages start."""

    STAGE_TABLE = {name: (_noting_threads(name, stage) if name in ("pretrain", "sft", "rl") else stage, trains)
                   for name, (stage, trains) in Pipeline.STAGE_TABLE.items()}

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: dict[str, int] = {}


@pytest.mark.slow
def test_pipeline_runs_every_stage_and_writes_the_report(tmp_path):
    full_reward = ["tasks.two_file_rate=0.5", "tasks.max_turns=7", "sft.parallel_rate=0.5", "sft.verify_rate=0.5",
                   "rl.length_coef=1e-3", "rl.kl_coef=1e-3", "rl.tool_error_coef=0.02", "rl.zero_failed_groups=true"]
    cfg = load_config(None, [f"run.out_dir={tmp_path / 'demo'}", *MINI, "run.num_threads=1", "run.train_threads=2",
                             "sft.decoy_rate=0.5", *full_reward])
    out = io.StringIO()
    p = ThreadsSeen(cfg, Console(file=out, width=120))
    index = p.run()
    assert p.seen == {"pretrain": 2, "sft": 2, "rl": 1}  # training alone on the cores; RL shares them

    assert (p.paths["tokenizer"] / "tokenizer.json").is_file()
    assert (p.paths["pretrain"] / "model" / "config.json").is_file()
    assert (p.paths["sft"] / "model" / "config.json").is_file()
    assert (p.rl_model_dir() / "config.json").is_file()
    train = {d.name for d in p.paths["train_suite"].iterdir() if d.is_dir()}
    held = {d.name for d in p.paths["heldout_suite"].iterdir() if d.is_dir()}
    rl = {d.name for d in p.paths["rl_suite"].iterdir() if d.is_dir()}
    assert len(train) == 8 and len(held) == 3 and len(rl) == 6
    assert not train & held and not rl & held and not rl & train
    trained = {json.loads(x)["task_id"] for x in (p.paths["rl"] / "trajectories.jsonl").read_text().splitlines()}
    assert trained and trained <= rl  # RL trains on its own tasks only
    for name in ("eval_sft", "eval_rl"):
        rows = [json.loads(x) for x in (p.paths[name] / "results.jsonl").read_text().splitlines()]
        assert {r["task_id"] for r in rows} == held  # both evaluations on exactly the held-out tasks
        assert all(r["status"] == "done" for r in rows)
    assert (p.paths["rl"] / "metrics.jsonl").read_text().count("\n") == 2

    report = p.paths["report"]
    assert index == report / "index.html" and index.is_file()
    for f in ("learning_curve.png", "efficiency.png", "README.md", "summary_demo.json", "eval/index.html",
              "eval/pareto.png"):
        assert (report / f).is_file(), f
    s = json.loads((report / "summary_demo.json").read_text())
    assert 0 <= s["sft_success"] <= 1 and 0 <= s["rl_success"] <= 1
    assert s["lift_points"] == pytest.approx(100 * (s["rl_success"] - s["sft_success"]))
    assert set(s["stage_wall_s"]) == set(Pipeline.STAGES) - {"report"}
    readme = (report / "README.md").read_text()
    assert "not real-world tasks" in readme
    decoys = sum(writes_decoy(t, 0.5, seed=0) for t in train)  # the demonstrator's choice, stated in the report
    assert 0 < decoys < 8 and s["sft_decoy_demonstrations"] == decoys
    assert f"{decoys} of the 8 demonstrations" in readme and "imperfect demonstrator" in readme.lower()
    for stage in ("sft", "rl"):  # every held-out episode counted once: resolved, the decoy fix, or another failure
        o = s["outcomes"][stage]
        assert sum(o.values()) == 3 and o["resolved"] == round(3 * s[f"{stage}_success"])
    assert f"{s['sft_success']:.1%}" in readme and f"{s['rl_success']:.1%}" in readme
    for stage in ("sft", "rl"):  # the efficiency figures count the same episodes, by task kind
        e = s["efficiency"][stage]
        assert e["easy"]["episodes"] + e["hard"]["episodes"] == 3
        assert e["easy"]["solved"] + e["hard"]["solved"] == s["outcomes"][stage]["resolved"]
    assert 0 < s["rl_penalty_share"]["first"] < 1  # the length penalty is in RL's reward
    assert "## Efficiency (issue 21)" in readme and "length penalty lambda 0.001" in readme
    assert str(index) in out.getvalue()

    again = io.StringIO()
    Pipeline(cfg, Console(file=again, width=120)).run()
    assert again.getvalue().count("skipped") == len(Pipeline.STAGES)
    from opencomposer.errors import ConfigError

    with pytest.raises(ConfigError, match="another config"):  # never a report mixing two configs
        Pipeline(load_config(None, [f"run.out_dir={tmp_path / 'demo'}", *MINI, "sft.lr=0.01"])).run()


def test_until_stops_after_the_named_stage_and_a_later_run_goes_on(tmp_path):
    from typer.testing import CliRunner

    from opencomposer.cli import app
    from opencomposer.errors import ConfigError

    cfg = load_config(None, [f"run.out_dir={tmp_path / 'demo'}", *MINI, "run.num_threads=1", "run.train_threads=1"])
    out = io.StringIO()
    p = Pipeline(cfg, Console(file=out, width=200))
    assert p.run(until="tasks") == tmp_path / "demo" / "tasks"
    assert [n for n in Pipeline.STAGES if p.record(n)] == ["tokenizer", "pretrain", "tasks"]
    assert "stopped after stage tasks" in out.getvalue()
    assert (p.paths["pretrain"] / "model" / "config.json").is_file() and not p.paths["sft"].exists()
    again = io.StringIO()
    assert Pipeline(cfg, Console(file=again, width=200)).run(until="pretrain") == p.paths["pretrain"]
    assert again.getvalue().count("skipped") == 2 and not p.record("sft")
    with pytest.raises(ConfigError, match="not a stage; the stages are tokenizer, pretrain"):
        p.run(until="train")
    bad = CliRunner().invoke(app, ["demo", "--until", "sfft", "--set", f"run.out_dir={tmp_path / 'other'}"])
    assert bad.exit_code == 1 and "'sfft' is not a stage" in bad.output and not (tmp_path / "other").exists()


def test_config_file_restates_the_defaults_and_bad_values_are_named():
    from opencomposer.errors import ConfigError
    from opencomposer.pipeline import PipelineConfig

    assert load_config(Path(__file__).parents[1] / "configs/demo/pipeline.yaml") == PipelineConfig()
    with pytest.raises(ConfigError, match="rl.steps x rl.groups_per_step"):
        load_config(None, ["tasks.n_rl=16"])  # RL would need more tasks than exist
    with pytest.raises(ConfigError, match="sft.stepz"):
        load_config(None, ["sft.stepz=3"])
    with pytest.raises(ConfigError, match="raise tasks.max_turns"):  # the demonstrator's episodes would be cut
        load_config(None, ["tasks.two_file_rate=0.5", "sft.parallel_rate=0.5", "sft.verify_rate=0.5"])
    assert load_config(None, ["tasks.two_file_rate=0.5", "sft.verify_rate=0.5", "tasks.max_turns=4"])
    with pytest.raises(ConfigError, match="sft.survey_rate 0.5"):  # the survey's turn: 5 turns, not 4
        load_config(None, ["tasks.two_file_rate=0.5", "sft.verify_rate=0.5", "sft.survey_rate=0.5", "tasks.max_turns=4"])
    assert load_config(None, ["tasks.two_file_rate=0.5", "sft.parallel_rate=0.5", "sft.verify_rate=0.5",
                              "sft.survey_rate=0.5", "tasks.max_turns=7"])
    one_file = ["tasks.two_file_rate=0.5", "sft.parallel_rate=0.5", "sft.verify_rate=0.5", "sft.survey_rate=0.5",
                "sft.habit_tasks=one_file"]  # 4 calls on two-file tasks, 2 + 2 habits on one-file ones
    assert load_config(None, [*one_file, "tasks.max_turns=5"]).sft.habit_tasks == "one_file"
    with pytest.raises(ConfigError, match="sft.habit_tasks one_file"):
        load_config(None, [*one_file, "tasks.max_turns=4"])
    with pytest.raises(ConfigError, match="sft.habit_tasks"):
        load_config(None, ["sft.habit_tasks=two_file"])


CONFIGS = Path(__file__).parents[1] / "configs" / "demo"


@pytest.mark.parametrize("name", ["pipeline_1gpu.yaml", "pipeline_ray_cluster.yaml"])
def test_gpu_and_cluster_sizings_validate_and_stop_before_any_stage_without_a_gpu(name, tmp_path):
    """The files are a plan for machines the tests do not have: they must load as they are, and
    `opencomposer demo --config` must refuse them here at once, naming the field, writing nothing."""
    import torch
    from typer.testing import CliRunner

    from opencomposer.cli import app
    from opencomposer.pipeline import DEFAULT_MODEL, PipelineConfig

    cfg = load_config(CONFIGS / name)
    assert cfg.run.device == "cuda" and cfg != PipelineConfig()
    assert Pipeline(cfg).model_dict()["hidden_size"] > DEFAULT_MODEL["hidden_size"]
    assert cfg.rl.group_size * cfg.rl.groups_per_step > PipelineConfig().rl.group_size * PipelineConfig().rl.groups_per_step
    if cfg.rl.runner == "ray":
        assert cfg.rl.ray.trainer_world_size > 1 and cfg.rl.ray.trainer_gpus >= 1 and cfg.rl.ray.inference_gpus >= 1
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: running the file is not a test")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["demo", "--config", str(CONFIGS / name), "--set", f"run.out_dir={out}"])
    assert result.exit_code == 1 and "run.device: 'cuda'" in result.output
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_the_rl_stage_runs_through_the_ray_runner(tmp_path):
    """rl.runner=ray at the miniature size: a local Ray instance of 2 CPUs (started and stopped by
    the RL stage), a rollout actor, the inference actor and a 1-rank trainer actor; the held-out
    evaluation then serves the checkpoint the Ray trainer saved."""
    import ray

    assert not ray.is_initialized()
    cfg = load_config(None, [f"run.out_dir={tmp_path / 'demo'}", *MINI, "rl.runner=ray", "rl.ray.num_cpus=2",
                             "rl.ray.rollout_actors=1", "rl.ray.trainer_world_size=1"])
    p = Pipeline(cfg, Console(file=io.StringIO(), width=120))
    p.run()

    rec = p.record("rl")
    assert rec["steps"] == 2 and rec["policy_version"] == 2
    metrics = [json.loads(x) for x in (p.paths["rl"] / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["trainer/world_size"] == 1 for m in metrics)
    rl = {d.name for d in p.paths["rl_suite"].iterdir() if d.is_dir()}
    trained = {json.loads(x)["task_id"] for x in (p.paths["rl"] / "trajectories.jsonl").read_text().splitlines()}
    assert trained and trained <= rl
    rows = [json.loads(x) for x in (p.paths["eval_rl"] / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "done" for r in rows)
    assert not ray.is_initialized()  # the stage stops the instance it started


def test_the_rl_stage_passes_the_reward_fields_to_the_rl_run(tmp_path, monkeypatch):
    """rl.length_* and the advantage gate reach the RL run's config (captured before it runs)."""
    import opencomposer.rl.launch as launch

    cfg = load_config(None, [f"run.out_dir={tmp_path / 'demo'}", *MINI, "run.num_threads=1", "run.train_threads=1",
                             "rl.length_coef=1e-3", "rl.length_scope=correct", "rl.length_q=0.5",
                             "rl.zero_failed_groups=true"])
    p = Pipeline(cfg, Console(file=io.StringIO(), width=200))
    p.run(until="eval_sft")
    seen = {}

    def capture(rl_cfg, resume):
        seen["cfg"] = rl_cfg
        raise RuntimeError("captured")

    monkeypatch.setattr(launch, "run_rl", capture)
    with pytest.raises(RuntimeError, match="captured"):
        p._rl()
    r = seen["cfg"].reward
    assert (r.length_coef, r.length_scope, r.length_q) == (1e-3, "correct", 0.5)
    assert seen["cfg"].advantage.zero_failed_groups
