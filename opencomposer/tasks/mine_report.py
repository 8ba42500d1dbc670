"""What mining one package gave, and why a package cannot be mined in the sandbox.

    MineReport          per package: source, requirements (declared, pinned, dropped), tests on
                        the untouched source (and why the failing ones fail), candidates tried,
                        valid, rejected with reasons, seconds; written as JSON beside the tasks
                        (<out>/mining/<package>-<version>.json) and summarized on stdout
    failure_reasons     groups the untouched source's failing tests by what they lack:
                        network, a service on localhost, a module (a compiled extension of the
                        package itself when it ships C/Cython/Rust sources), time, or other
    sandbox_blocker     the reason to stop before mining, or None: most tests fail for a reason
                        the sandbox cannot give (mining the rest would cover a fraction of the
                        package and grade against tests that cannot run)

Left out: telling a service from a network peer on any port but localhost's (both are
"network" unless the address is local).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

NETWORK = re.compile(r"gaierror|Name or service not known|Temporary failure in name resolution|Network is "
                     r"unreachable|nodename nor servname|No address associated|NewConnectionError|"
                     r"ConnectTimeout|getaddrinfo|Max retries exceeded|URLError|No route to host")
SERVICE = re.compile(r"Connection refused|ConnectionRefusedError|could not connect to server|OperationalError|"
                     r"Cannot connect to|\[Errno 111\]")
MISSING = re.compile(r"No module named '([^']+)'|cannot import name '([^']+)'")
COMPILED = (".c", ".cc", ".cpp", ".pyx", ".rs", ".f90")
COMPILED_BACKENDS = ("mesonpy", "maturin", "scikit_build_core", "setuptools_rust", "cmake")
MAX_FAILING_FRAC = 0.5
"""More failing tests than this share, for reasons the sandbox cannot give: the package is not mined."""


@dataclass
class MineReport:
    package: str
    version: str
    source: dict = field(default_factory=dict)
    """The task's source (kind, sha256; path and commit for a local directory)."""
    tasks: list[str] = field(default_factory=list)
    """Ids of the tasks in --out for this package (new and already there)."""
    new: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    """Candidate id -> why it was rejected (this run and earlier ones)."""
    tried: dict[str, str] = field(default_factory=dict)
    """Candidates tried in this run -> "valid" or why not."""
    tests_total: int = 0
    tests_passing: int = 0
    failing: dict[str, int] = field(default_factory=dict)
    """Tests failing on the untouched source, by reason (failure_reasons)."""
    requirements: dict = field(default_factory=dict)
    """declared runtime/test requirements, where they came from, pins, dropped test requirements."""
    compiled: list[str] = field(default_factory=list)
    """Compiled-extension sources or build backends the project ships (they are never built)."""
    error: str = ""
    """Why mining stopped, if it did (no tests, requirements that do not install, a sandbox blocker)."""
    duration_s: float = 0.0

    def summary(self) -> str:
        head = f"{self.package}=={self.version}"
        if self.error:
            why = self.error.splitlines()[0].removeprefix(f"{head}: ").removeprefix("not mined: ")
            return f"{head}: not mined: {why[:400]}"
        valid = sum(v == "valid" for v in self.tried.values())
        why = Counter(_reason_kind(r) for r in self.tried.values() if r != "valid")
        lines = [f"{head}: {len(self.tasks)} tasks ({len(self.new)} new); tried {len(self.tried)} candidates, "
                 f"{valid} valid, {len(self.tried) - valid} rejected; tests passing on the source "
                 f"{self.tests_passing}/{self.tests_total}; {self.duration_s:.0f} s"]
        lines += [f"  rejected: {n} x {k}" for k, n in why.most_common()]
        if self.failing:
            lines.append("  failing on the untouched source: " + ", ".join(f"{k} {n}" for k, n in self.failing.items()))
        if self.requirements.get("dropped"):
            lines.append(f"  test requirements dropped: {'; '.join(self.requirements['dropped'])[:300]}")
        return "\n".join(lines)

    def write(self, out: Path) -> Path:
        path = Path(out) / "mining" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', self.package)}-{self.version}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")
        return path


def _reason_kind(reason: str) -> str:
    """A rejection reason without its numbers and test ids, for counting."""
    first = reason.split(";")[0]
    first = re.sub(r"\S+::\S+", "<test>", first)
    return re.sub(r"\d+", "N", first)[:120]


def compiled_sources(root: Path, test_paths: list[str]) -> list[str]:
    """Compiled-extension sources outside the tests, and a compiling build backend, if any."""
    root = Path(root)
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in COMPILED and p.is_file()
                   and not any(p.relative_to(root).as_posix().startswith(t) for t in test_paths))
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text(errors="replace")
        found += [f"build backend {b}" for b in COMPILED_BACKENDS if re.search(rf"\b{b}\b", text)]
    setup = root / "setup.py"
    if setup.is_file() and re.search(r"\bext_modules\s*=|\bExtension\(", setup.read_text(errors="replace")):
        found.append("setup.py ext_modules")
    return found[:20]


def failure_reasons(errors: dict[str, str], outcomes: dict[str, str], package: str, compiled: list[str]) -> Counter:
    """Failing tests (and files that did not collect) of the untouched source, by reason."""
    mod = re.sub(r"[-.]+", "_", package).lower()
    reasons: Counter = Counter()
    for nid, outcome in outcomes.items():
        if outcome in ("failed", "error"):
            reasons[_classify(errors.get(nid, ""), mod, compiled)] += 1
    for nid, err in errors.items():
        if "::" not in nid and nid not in outcomes:  # a test file that failed to import
            reasons[f"file does not collect: {_classify(err, mod, compiled)}"] += 1
    return reasons


def _classify(err: str, mod: str, compiled: list[str]) -> str:
    if NETWORK.search(err):
        return "network"
    if SERVICE.search(err) and re.search(r"localhost|127\.0\.0\.1|::1|Errno 111|refused", err):
        return "service on localhost"
    m = MISSING.search(err)
    if m:
        name = m.group(1) or m.group(2)
        if compiled and name.split(".")[0].lower() == mod:
            return f"compiled extension {name} (not built)"
        return f"missing module {name.split('.')[0]}" if m.group(1) else f"import error ({name})"
    if "Timeout" in err or "timed out" in err:
        return "timeout"
    return "assertion or other"


def sandbox_blocker(reasons: Counter, total: int) -> str | None:
    """Why the package cannot be mined here, or None (see the module docstring)."""
    blocking = {k: n for k, n in reasons.items() if "assertion or other" not in k}
    lost = sum(blocking.values())
    if total == 0 or lost <= MAX_FAILING_FRAC * max(total, 1):
        return None
    parts = ", ".join(f"{k} ({n})" for k, n in sorted(blocking.items(), key=lambda kv: -kv[1])[:5])
    return (f"{lost} of {total} tests fail on the untouched source for what the sandbox cannot give: {parts}. "
            f"Network and services are off in the sandbox; compiled extensions are not built; a missing module "
            f"not in the package's metadata can be added to mine.PACKAGES")
