"""metrics.jsonl and TensorBoard for one run, with resume semantics every trainer shares.

One row per `write(step, values)`: `{"step": step, **values}` as a JSON line (flushed at once, so
a killed run loses nothing it logged), and each numeric value (bools included) as a TensorBoard
scalar at that step. Several rows may share a step (pretraining logs an evaluation row beside the
training row).

Resuming from a checkpoint taken after step S: every row of steps 1..S was written before that
checkpoint was saved, and step S+1 is the first the resumed run writes. So rows of steps ≤ S are
kept and rows past S (steps the killed run took after its last checkpoint, which the resumed run
takes again) are dropped, in both outputs: metrics.jsonl is truncated to steps ≤ S, and the
TensorBoard writer starts with purge_step S+1, which hides every older event at a step ≥ S+1.
A fresh run (resume_step None) keeps nothing of an earlier run in the same directory (purge
step 0). Left out: other backends (wandb, mlflow) and aggregation across ranks (the caller
writes from rank 0 only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    """<run_dir>/metrics.jsonl, and TensorBoard scalars under <run_dir>/tb (module docstring)."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool, resume_step: int | None = None):
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        kept = []
        if resume_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.file = self.path.open("a")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=0 if resume_step is None else resume_step + 1)

    def write(self, step: int, values: dict[str, Any]) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
