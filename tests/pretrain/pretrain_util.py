"""Helpers shared by the pretrain tests (a unique module name: every tests/ folder has a conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def write_config(cfg: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def read_metrics(run_dir: str | Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
