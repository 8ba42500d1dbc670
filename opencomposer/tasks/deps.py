"""Resolve a project's declared requirements to exact pins, and find the pytest plugins among them.

    resolve(base, declared, name, backend) -> Resolution(pins, dropped, log)
    pytest_plugin_args(env_layer, backend) -> ["-p", "pytest_asyncio.plugin", ...]

Resolution is pip's own (`pip install --dry-run --ignore-installed --report`), run inside a
sandbox with the network (pip builds metadata of sdists, which runs their code), for the
Python the task venvs use. The pins are the whole closure, so the venv layer build
(build.env_layer) and its lock.txt install exactly what was resolved. The miner's base pins
(pytest, coverage) win: a test requirement that cannot be installed beside them, or at all,
is dropped and reported, not fatal; a runtime requirement that cannot be is fatal (the
package would not import).

The grader turns plugin autoload off, so a plugin a test suite relies on (pytest-asyncio,
pytest-mock, ...) must be named with `-p`; pytest_plugin_args reads the pytest11 entry
points installed in the venv.

Left out: private indexes (only PyPI and local --find-links directories) and per-platform
locks (the pins are for this machine's Python).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from opencomposer.errors import TaskError
from opencomposer.sandbox.base import Backend
from opencomposer.tasks.build import BUILD_LIMITS, FIND_LINKS, SYSTEM_PYTHON, _empty_dir, find_links_layer
from opencomposer.tasks.metadata import TOOLS, Declared, norm
NOT_PLUGINS = {"pytest-randomly", "pytest-cov", "pytest-xdist", "pytest-timeout"} | {
    n for n in TOOLS if n.startswith("pytest-")}
"""Installed plugins the miner does not load: they reorder, re-measure or parallelize the run,
or add lint checks as test items (metadata.TOOLS; they can still arrive as a dependency)."""


@dataclass
class Resolution:
    pins: list[str]
    """name==version for every distribution to install, the base pins included, sorted."""
    dropped: list[str] = field(default_factory=list)
    """Test requirements left out, each with the reason."""
    self_required: bool = False
    """Some requirement depends on the package under test itself (it must not be installed)."""


def _pip_dry_run(reqs: list[str], backend: Backend, find_links: Path | None) -> tuple[dict | None, str]:
    """(pip's install report, or None if it failed; pip's output)."""
    layers = [_empty_dir()] + ([find_links_layer(find_links)] if find_links else [])
    ws = backend.image(layers).workspace()
    try:
        links = ["--find-links", f"/workspace/{FIND_LINKS}"] if find_links else []
        args = " ".join(f"'{r}'" for r in reqs)
        res = ws.exec(f"{SYSTEM_PYTHON} -m venv /tmp/r && /tmp/r/bin/pip install --dry-run --ignore-installed "
                      f"--no-cache-dir --disable-pip-version-check --no-input --quiet --report /workspace/report.json "
                      f"{' '.join(links)} {args}", limits=BUILD_LIMITS)
        report = ws.root / "report.json"
        if not res.ok or not report.is_file():
            return None, (res.stdout + res.stderr)[-4000:]
        return json.loads(report.read_text()), ""
    finally:
        ws.close()


def _blamed(log: str, names: set[str]) -> set[str]:
    """The requirement names pip's error output blames."""
    found = set()
    for m in re.finditer(r"(?:No matching distribution found for|satisfies the requirement|"
                         r"conflict is caused by:\s+The user requested|metadata generation failed.*?for|"
                         r"Failed to build|requested) ([A-Za-z0-9._\[\]-]+)", log, re.S):
        found.add(norm(m.group(1).split("[")[0]))
    for m in re.finditer(r"\n\s+([A-Za-z0-9._-]+) [\d.]+\S* depends on", log):
        found.add(norm(m.group(1)))
    return found & names


def resolve(base: list[str], declared: Declared, name: str, backend: Backend,
            find_links: Path | None = None) -> Resolution:
    """Pins for base + declared.runtime + declared.test; see the module docstring."""
    test = list(declared.test)
    dropped: list[str] = []
    for _ in range(4):
        report, log = _pip_dry_run([*base, *declared.runtime, *test], backend, find_links)
        if report is not None:
            break
        names = {norm(Requirement(r).name): r for r in test}
        blamed = _blamed(log, set(names))
        if not blamed:  # a conflict pip did not pin on one name: keep runtime, drop the tests' extras
            blamed = set(names)
        dropped += [f"{names[n]} (pip could not install it beside the rest: {_last_error(log)})" for n in sorted(blamed)]
        test = [r for r in test if norm(Requirement(r).name) not in blamed]
    else:
        report = None
    if report is None:
        raise TaskError(f"{name}: its runtime requirements {declared.runtime} cannot be installed with "
                        f"{base}:\n{log}")
    pins, self_required = [], False
    for item in report["install"]:
        meta = item["metadata"]
        if norm(meta["name"]) == norm(name):
            self_required = True
            continue
        pins.append(f"{meta['name']}=={meta['version']}")
    return Resolution(sorted(pins, key=str.lower), dropped, self_required)


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "ERROR" in line or "error:" in line.lower()]
    return (lines[-1] if lines else log.strip().splitlines()[-1] if log.strip() else "no output")[:200]


_PLUGINS = ("import importlib.metadata as m, json; print(json.dumps(sorted({(e.dist.name, e.value.split(':')[0]) "
            "for e in m.entry_points(group='pytest11')})))")


def pytest_plugin_args(env: Path, backend: Backend) -> list[str]:
    """`-p MODULE` for every pytest plugin installed in the venv layer `env` (autoload is off)."""
    ws = backend.image([_empty_dir(), env]).workspace()
    try:
        res = ws.exec([".venv/bin/python", "-I", "-c", _PLUGINS])
    finally:
        ws.close()
    if not res.ok:
        raise TaskError(f"listing the venv's pytest plugins failed:\n{res.stderr[-2000:]}")
    args = []
    for dist, module in json.loads(res.stdout):
        if norm(dist) not in NOT_PLUGINS:
            args += ["-p", module]
    return args
