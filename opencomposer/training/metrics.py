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
A fresh run (resume_step None) keeps nothing of an earlier run in the same directory: its old
event files are deleted. TensorBoard reads a directory's event files in the order of their names,
`events.out.tfevents.<unix second>.<host>.<pid>.<counter>`, and purge_step only hides events read
before it; two writers opened in the same second (a resume within a second of the last write, as in
tests) could sort the wrong way round by their counters (`.10` before `.9`), so the resumed writer
waits for the next second. Left out: other backends (wandb, mlflow) and aggregation across ranks (the caller
writes from rank 0 only).
"""

from __future__ import annotations

import json
import shutil
import time
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

            tb_dir = run_dir / "tb"
            if resume_step is None:
                shutil.rmtree(tb_dir, ignore_errors=True)
            else:
                _after_newest_event_file(tb_dir)
            self.tb = SummaryWriter(str(tb_dir), purge_step=None if resume_step is None else resume_step + 1)

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


def _after_newest_event_file(tb_dir: Path) -> None:
    """Sleep until the clock's second is past the newest event file's, so a new file sorts after it."""
    # events.out.tfevents.<second>.<host>...: the glob guarantees field 3 exists
    stamps = [int(f) for f in (p.name.split(".")[3] for p in tb_dir.glob("events.out.tfevents.*")) if f.isdigit()]
    if stamps and time.time() < max(stamps) + 1:
        time.sleep(max(stamps) + 1 - time.time())
