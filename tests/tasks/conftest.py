"""Fixtures for the tasks tests: one bwrap backend and one small generated task per session.

The venv layer (pytest pinned) is built once into the normal cache (OPENCOMPOSER_CACHE or
~/.cache/opencomposer); a cold cache needs PyPI once, later runs reuse it.
"""

from __future__ import annotations

import pytest

from opencomposer.sandbox import get_backend
from opencomposer.tasks.smoke import MUTATIONS, make_task
from opencomposer.tasks.task import Task


@pytest.fixture(scope="session")
def backend():
    return get_backend("bwrap")


@pytest.fixture(scope="session")
def clamp_task(tmp_path_factory, backend) -> Task:
    """mathkit: `clamp` returns hi inside the range. f2p: test_clamp; p2p: test_gcd, test_is_prime, test_mean."""
    m = next(m for m in MUTATIONS if m.qualname == "clamp" and m.kind == "flip_operator")
    return Task.load(make_task((m,), tmp_path_factory.mktemp("tasks"), backend))

