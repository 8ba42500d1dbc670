"""Packing's tests run the RL trainer's tiny model and step helpers (tests/rl/), which pytest
puts on the import path only for tests collected from that folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))
