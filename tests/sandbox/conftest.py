"""Fixtures for sandbox tests: a private layer store per test and a small project tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.sandbox.bwrap import BwrapBackend
from opencomposer.sandbox.layers import mounts_under


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    yield root
    leftover = mounts_under(root)
    assert not leftover, f"mounts left behind: {leftover}"


@pytest.fixture
def backend(store: Path) -> BwrapBackend:
    return BwrapBackend(store)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small source tree: text files, a nested package, an executable script, a symlink."""
    root = tmp_path / "project"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "README.md").write_text("# demo\n\nA small project.\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "core.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    (root / "pkg" / "sub" / "deep.py").write_text("VALUE = 1\n")
    (root / "pkg" / "sub" / "other.py").write_text("OTHER = 2\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("README.md")
    return root
