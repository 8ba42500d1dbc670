"""Shared pieces of the agentic RL tests: smoke tasks, a fake-engine policy, a sleepy trainer,
and a micro MoE config for real trainer steps in seconds."""

import time
from pathlib import Path

import yaml

from opencomposer.engine.client import InProcessClient
from opencomposer.engine.fake import FakeEngine
from opencomposer.harness.agent import AgentConfig, TokenClientPolicy
from opencomposer.model.tokenizer import bundled_tokenizer
from opencomposer.rl.config import AgenticConfig
from opencomposer.rl.rollout import RolloutConfig
from opencomposer.tasks.task import Suite

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tasks" / "suites" / "smoke"
TOK = bundled_tokenizer()
FEW_TOOLS = ["read_file", "edit_file", "run_terminal_cmd"]  # a ~900-token prompt instead of ~2,300

MICRO_MODEL = dict(vocab_size=4096, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rope_theta=10000.0,
                   max_position_embeddings=4096, tie_word_embeddings=False, num_mtp_modules=0)


def smoke_tasks(n=None):
    tasks = Suite.load(SMOKE).tasks
    return tasks[:n] if n else tasks


def fake_policy(step_delay_s=0.002, max_len=4096):
    """A FakeEngine behind the same token-level client the real engine uses."""
    engine = FakeEngine(max_len=max_len, step_delay_s=step_delay_s)
    policy = TokenClientPolicy(InProcessClient(engine, TOK), TOK, name="fake")
    return engine, policy


def agentic(task_timeout_s: float = 60, **kw) -> AgenticConfig:
    rollout = RolloutConfig(group_size=2, task_timeout_s=task_timeout_s,
                            agent=AgentConfig(max_turns=2, max_new_tokens=8, summarize_at=None, tools=FEW_TOOLS))
    return AgenticConfig(suite=str(SMOKE), rollout=rollout, **{"groups_per_step": 2, "rollout_workers": 3, **kw})


class SleepyTrainer:
    """Trainer stand-in: takes `delay_s` per step and records what it was given."""

    def __init__(self, delay_s=0.0, fail_at=None):
        self.version, self.delay_s, self.fail_at = 0, delay_s, fail_at
        self.batches = []

    def step(self, groups):
        if self.fail_at is not None and len(self.batches) + 1 == self.fail_at:
            raise RuntimeError("trainer killed")
        time.sleep(self.delay_s)
        self.batches.append(list(groups))
        self.version += 1
        return {"loss": 0.0}

    def trained_task_ids(self):
        return [g.task_id for b in self.batches for g in b]


def engine_sync(engine):
    return lambda version: {"sync/version": float(engine.update_weights({}, version))}


def write_rl_config(tmp_path, **sections) -> Path:
    """A mode-agentic YAML with the micro model (written next to it) and the given section overrides."""
    (tmp_path / "micro.yaml").write_text(yaml.safe_dump(MICRO_MODEL))
    cfg = {"mode": "agentic", "run": {"out_dir": str(tmp_path / "run"), "seed": 0},
           "model": {"config": "micro.yaml"}, "engine": {"max_slots": 8, "max_len": 1536},
           "sampling": {"max_new_tokens": 16}, "train": {"max_steps": 2, "micro_batch_size": 4,
                                                         "optim": {"lr": 1e-3}},
           "checkpoint": {"every_steps": 1}, "log": {"tensorboard": True},
           "agentic": {"suite": str(SMOKE), "tasks": ["*"], "groups_per_step": 2, "rollout_workers": 2,
                       "rollout": {"group_size": 2, "task_timeout_s": 60,
                                   "agent": {"max_turns": 2, "tools": FEW_TOOLS, "summarize_at": None}}}}
    for key, value in sections.items():
        section, _, field = key.partition("__")
        if field:
            cfg.setdefault(section, {})[field] = value
        else:
            cfg[section] = value
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
