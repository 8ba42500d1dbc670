"""The miner: tasks from a real project (a PyPI sdist or a local directory), verified by its own tests.

    opencomposer tasks mine (--sdist PATH | --package NAME==VERSION | --source DIR) --out DIR [--max-tasks N]

1. Image: the sdist (or a copy of the local tree: local.py, its files' hash and git commit
   recorded) becomes a source layer, the venv an env layer with pytest + coverage pinned
   (BASE_REQUIREMENTS) plus the package's declared runtime and test requirements
   (metadata.py reads them from its files, deps.py resolves and pins them with pip in a
   sandbox; PACKAGES adds what metadata cannot say), and a .pth file that puts the source
   tree on sys.path (no build backend needed, and edits to the source are live). Installed
   pytest plugins are loaded with -p (the grader turns autoload off).
2. Coverage map: the test suite runs once in the sandbox with one coverage context per test
   (coverage_map.py); each function body's lines give the passing tests that exercise it.
3. Candidates:
   - features: groups of functions, in at least two files, that a cluster of tests exercises.
     Greedy growth from a seed function: add the function whose test set overlaps most with
     the group's (Jaccard), until the gold patch would reach a drawn size in
     `settings.lines`; the union of their tests may not exceed `max_f2p_frac` of the suite
     (the rest must keep passing). Bodies are removed with libcst (transform.remove_bodies).
   - variants: SWE-smith-style procedural bugs in one covered function (transform.mutate).
   Functions whose body runs at import time, stubs and one-liners are never chosen.
4. Each candidate is applied to a fresh workspace and the whole suite runs: fail-to-pass =
   tests that passed on the sdist and fail now (measured, not guessed); pass-to-pass = a sample
   of the still-passing tests related to the change (same test files, or covering the changed
   files). Every failing test is deleted from the visible test files (the full files go to
   hidden_tests/); break.patch = bodies removed + tests hidden; gold.patch = bodies restored.
   Not graded: tests a package marks timing-sensitive (PackageConfig.exclude) and tests
   failing with more than `max_failures` subtest reports (too slow to grade).
5. Validation (validate.validate_task, `runs` times): broken fails every f2p and passes
   every p2p, gold passes all. Flaky tests are dropped and the task validated again; a task
   that is still invalid is rejected (recorded, and skipped on later runs).

Resumable: task directories already in --out count toward --max-tasks; the resolved pins, the
coverage map and the rejected candidates are kept under $OPENCOMPOSER_CACHE/mine/<package>-<version>-<sha>/.
Deterministic for a given source, seed and settings (and resolved pins, which are cached).
Every run writes a report (mine_report.py) to <out>/mining/<package>-<version>.json, also when
it stops: a package most of whose tests fail on the untouched source for what the sandbox
cannot give (network, a service, a compiled extension that is not built) is not mined.

Left out: building C extensions, tests outside pytest's collection (doctest files), and
instructions written by a language model.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import re
import shutil
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from opencomposer.errors import TaskError
from opencomposer.sandbox.base import Backend, Image
from opencomposer.tasks.build import default_backend, env_layer, source_layer
from opencomposer.tasks.cache import cache_dir
from opencomposer.tasks.coverage_map import FunctionCoverage, TestRun, coverage_map, run_tests
from opencomposer.tasks.deps import Resolution, pytest_plugin_args, resolve
from opencomposer.tasks.grade import is_protected
from opencomposer.tasks.instruction import bug_instruction, feature_instruction
from opencomposer.tasks.local import git_commit, local_source_layer, tree_files, tree_hash
from opencomposer.tasks.metadata import BASE_REQUIREMENTS, declared_requirements, norm, project_identity
from opencomposer.tasks.mine_report import MineReport, compiled_sources, failure_reasons, sandbox_blocker
from opencomposer.tasks.sdist import fetch_sdist, find_test_paths, pth_setup, sdist_metadata
from opencomposer.tasks.task import (BREAK_PATCH, GOLD_PATCH, HIDDEN_DIR, SUITE_FILE, Environment, Source, Stats,
                                     Suite, SuiteSpec, Task, TaskSpec, TaskTests, patch_stats, tree_diff)
from opencomposer.tasks.transform import KINDS, mutate, mutation_sites, remove_bodies, remove_tests
from opencomposer.tasks.validate import validate_task

MINER_VERSION = "1"
CREATED = "2026-01-01T00:00:00Z"
LEGACY_BASE = ["pytest==8.4.2", "coverage==7.17.5"]
"""For test suites that use what pytest 9 removed (flask 3.1's `_pytest.monkeypatch.notset`):
the last pytest 8, its own dependencies resolved with the package's."""
_PYTEST_INTERNALS = re.compile(r"_pytest|module 'pytest' has no attribute|from 'pytest'|PytestRemovedIn")


class PytestTooNew(TaskError):
    """Most of the untouched source's tests fail inside pytest's own API: retry with LEGACY_BASE."""
MIN_PASSING = 20
"""Fewer passing tests than this cannot separate a feature's tests from the rest."""


@dataclass(frozen=True)
class PackageConfig:
    """What a package's tests need that its metadata does not say (metadata.py reads the rest)."""

    requirements: tuple[str, ...] = ()
    """Extra test dependencies, resolved together with the declared ones."""
    tests: tuple[str, ...] = ()
    """Paths given to pytest; () finds tests/, test/ or <package>/tests."""
    pytest_args: tuple[str, ...] = ()
    """Extra pytest arguments (also used by the grader), e.g. ("--ignore=tests/test_slow.py",)."""
    exclude: tuple[str, ...] = ()
    """fnmatch patterns of node ids never graded (timing-sensitive tests flake on a loaded machine)."""


PACKAGES = {
    "toolz": PackageConfig(tests=("toolz/tests",)),
    "more-itertools": PackageConfig(),
    "jmespath": PackageConfig(),
    "tomlkit": PackageConfig(),
    "mistune": PackageConfig(exclude=("tests/test_security_*.py::*", "tests/test_inline_limits.py::*")),
    "semver": PackageConfig(),
    "cachetools": PackageConfig(),
    "humanize": PackageConfig(requirements=("freezegun==1.5.5", "python-dateutil==4.0.0"),
                              pytest_args=("--ignore=tests/test_benchmarks.py",)),
    "markdown": PackageConfig(requirements=("pyyaml==6.0.4",)),
    "simplejson": PackageConfig(tests=("simplejson/tests",)),
    "boltons": PackageConfig(),
    "isodate": PackageConfig(),
}
"""Packages of the ocbench suites, with their test needs (anything else gets the defaults)."""


@dataclass
class Settings:
    """Miner knobs; recorded in suite.toml's [miner] table."""

    seed: int = 0
    max_tasks: int = 8
    """Tasks per package (existing ones in --out included)."""
    variants: int = 1
    """Of those, procedural-bug tasks (the rest are features)."""
    lines: tuple[int, int] = (160, 360)
    """A feature's target gold-patch size (added + removed lines) is drawn from this range."""
    min_lines: int = 100
    max_functions: int = 16
    """Features smaller than this are not tried."""
    max_f2p_frac: float = 0.35
    """At most this share of the passing tests may fail on the broken workspace."""
    max_p2p: int = 150
    """Pass-to-pass tests kept per task (a deterministic sample of the related ones)."""
    max_failures: int = 10
    """Tests failing with more reports than this (subtests) are left out of fail-to-pass: each
    failure costs the grader a formatted traceback, and thousands make grading time out."""
    runs: int = 2
    """Validation repeats (flakiness)."""


# ---------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One way to break the package: bodies of `functions` removed, or one procedural bug."""

    kind: str
    """"feature" or one of transform.KINDS."""
    functions: list[FunctionCoverage]
    site: int = 0

    def broken(self, sources: dict[str, str]) -> dict[str, str]:
        """{path: broken text} for every source file the candidate changes."""
        if self.kind != "feature":
            fc = self.functions[0]
            return {fc.path: mutate(sources[fc.path], fc.unit.key, self.kind, self.site)}
        keys: dict[str, list] = {}
        for fc in self.functions:
            keys.setdefault(fc.path, []).append(fc.unit.key)
        return {path: remove_bodies(sources[path], ks) for path, ks in keys.items()}

    def task_id(self, package: str) -> str:
        first = re.sub(r"[^A-Za-z0-9]+", "_", self.functions[0].unit.qualname).strip("_")
        what = [f"{fc.path}:{fc.unit.qualname}:{fc.unit.index}" for fc in self.functions]
        digest = hashlib.sha1(json.dumps([self.kind, self.site, sorted(what)]).encode()).hexdigest()[:6]
        kind = "feat" if self.kind == "feature" else self.kind.replace("_", "-")
        return f"{norm(package)}-{kind}-{first}-{digest}"

    def instruction(self) -> str:
        if self.kind == "feature":
            return feature_instruction([(fc.path, fc.unit.qualname, fc.unit.doc) for fc in self.functions])
        fc = self.functions[0]
        return bug_instruction(fc.path, fc.unit.qualname, fc.unit.doc, self.kind)


def eligible(fc: FunctionCoverage, max_tests: int) -> bool:
    """A function worth removing: tested, not run at import, more than a one-liner."""
    u = fc.unit
    return bool(fc.tests) and not fc.import_time and not u.is_stub and u.body_lines >= 2 and len(fc.tests) <= max_tests


def feature_candidates(cov: dict, n_tests: int, settings: Settings, rng: random.Random,
                       limit: int = 10**9) -> list[Candidate]:
    """Up to `limit` groups of functions across >= 2 files exercised by overlapping tests (module docstring)."""
    max_tests = max(3, int(settings.max_f2p_frac * n_tests))
    pool = sorted((fc for fc in cov.values() if eligible(fc, max_tests)),
                  key=lambda fc: (-fc.unit.body_lines, fc.key))
    if len({fc.path for fc in pool}) < 2:
        return []
    used: dict = {}
    seen: set[frozenset] = set()
    out = []
    for seed in pool:
        if len(out) >= limit:
            break
        if used.get(seed.key, 0):
            continue
        target = rng.randint(*settings.lines)
        group, tests, lines = [seed], set(seed.tests), seed.unit.body_lines + 1
        while lines < target or len({fc.path for fc in group}) < 2:
            need_file = lines >= target
            best, best_score = None, None
            for fc in pool:
                if fc in group or used.get(fc.key, 0) >= 2 or (need_file and fc.path in {g.path for g in group}):
                    continue
                union = tests | fc.tests
                if (len(union) > max_tests or lines + fc.unit.body_lines > 2 * settings.lines[1]
                        or len(group) >= settings.max_functions):
                    continue
                score = (len(tests & fc.tests) / len(union), fc.path == seed.path, fc.unit.body_lines)
                if best_score is None or score > best_score:
                    best, best_score = fc, score
            if best is None:
                break
            group.append(best)
            tests |= best.tests
            lines += best.unit.body_lines + 1
        keyset = frozenset(fc.key for fc in group)
        if lines < settings.min_lines or len({fc.path for fc in group}) < 2 or keyset in seen:
            continue
        seen.add(keyset)
        for fc in group:
            used[fc.key] = used.get(fc.key, 0) + 1
        group.sort(key=lambda fc: (fc.path != seed.path, fc.path, fc.unit.def_line))
        out.append(Candidate("feature", group))
    return out


def variant_candidates(cov: dict, sources: dict[str, str], n_tests: int, settings: Settings,
                       rng: random.Random) -> Iterator[Candidate]:
    """Procedural bugs: (function, kind) pairs in a seeded order, each at a random site.

    Lazy, because counting sites parses the file with libcst (seconds for a 5,000-line
    module) and only a few variants are wanted.
    """
    max_tests = max(3, int(settings.max_f2p_frac * n_tests))
    pairs = [(fc, kind) for fc in sorted(cov.values(), key=lambda fc: fc.key)
             if eligible(fc, max_tests) and fc.unit.body_lines >= 4 for kind in KINDS]
    rng.shuffle(pairs)
    for fc, kind in pairs:
        n = mutation_sites(sources[fc.path], fc.unit.key, kind)
        if n:
            yield Candidate(kind, [fc], rng.randrange(n))


# ---------------------------------------------------------------- the miner


class Miner:
    """Mines one project (an unpacked sdist, or a local directory) into task directories under `out`.

    `source_root` is the project's source layer; `origin` is what tasks record as their source.
    """

    def __init__(self, source_root: Path, origin: Source, out: Path, settings: Settings,
                 backend: Backend | None = None, find_links: Path | None = None,
                 base: list[str] = BASE_REQUIREMENTS):
        self.backend = backend or default_backend()
        self.base = list(base)
        self.find_links = Path(find_links).resolve() if find_links else None
        self.out, self.settings, self.origin = Path(out), settings, origin
        self.name, self.version, self.sha256 = origin.package, origin.version, origin.sha256
        self.source = Path(source_root)
        self.config = PACKAGES.get(norm(self.name), PackageConfig())
        self.test_paths = list(self.config.tests) or find_test_paths(self.source, self.name)
        if not self.test_paths or not any((self.source / p).exists() for p in self.test_paths):
            raise TaskError(f"{self.name}=={self.version}: its sdist ships no test suite (no tests/, test/ or "
                            f"<package>/tests with test_*.py files); the miner needs the tests in the sdist. "
                            f"Pick another version or package, or name the test paths in mine.PACKAGES.")
        if norm(self.name) in {norm(r.split("==")[0]) for r in BASE_REQUIREMENTS}:
            raise TaskError(f"{self.name}: the test venv already installs it (a dependency of pytest or of the "
                            f"tests), which would shadow the source under test; mine another package")
        self.state_dir = cache_dir() / "mine" / f"{norm(self.name)}-{self.version}-{self.sha256[:12]}"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.compiled = compiled_sources(self.source, self.test_paths)
        self.declared = declared_requirements(self.source, self.name)
        self.resolution = self.resolve()
        setup = [pth_setup(self.source)]
        if self.resolution.self_required:  # a test dependency pulls in the package itself: it would shadow the source
            setup.insert(0, f".venv/bin/pip uninstall -y --disable-pip-version-check {self.name}")
        self.env = Environment(requirements=self.resolution.pins, setup=setup,
                               pytest_args=list(self.config.pytest_args),
                               find_links=str(self.find_links) if self.find_links else None)
        self._image: Image | None = None

    # -- requirements, image and baseline

    def resolve(self) -> Resolution:
        """Pins for the declared requirements (cached: re-mining must not pick up new releases)."""
        base = [*self.base, *self.config.requirements]
        key = hashlib.sha256(json.dumps([base, asdict(self.declared)]).encode()).hexdigest()
        path = self.state_dir / "resolution.json"
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return Resolution(**data["resolution"])
        res = resolve(base, self.declared, self.name, self.backend, self.find_links)
        path.write_text(json.dumps({"key": key, "resolution": asdict(res)}, indent=1))
        return res

    def image(self) -> Image:
        """The source + venv image; building the venv also finds the pytest plugins to load."""
        if self._image is None:
            try:
                env = env_layer(self.env.requirements, setup=self.env.setup, source=self.source,
                                backend=self.backend, find_links=self.find_links)
            except TaskError as e:
                raise TaskError(f"{self.name}=={self.version}: its requirements do not install in the sandbox "
                                f"(a compiled extension without its compiler or headers?): {e}") from None
            self.env.pytest_args = [*pytest_plugin_args(env, self.backend), *self.config.pytest_args]
            self._image = self.backend.image([self.source, env])
        return self._image

    def baseline(self) -> TestRun:
        """The coverage run on the untouched sdist (cached)."""
        self.image()
        path = self.state_dir / "baseline.json"
        key = hashlib.sha256(json.dumps([self.env.model_dump(), self.test_paths]).encode()).hexdigest()
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return TestRun.from_json(data["run"])
        ws = self.image().workspace()
        try:
            run = run_tests(ws, self.test_paths, self.env.pytest_args, cover=True)
        finally:
            ws.close()
        run.outcomes = {t: o for t, o in run.outcomes.items() if ".py::" in t}
        failing = [e for t, e in run.errors.items() if run.outcomes.get(t, "error") in ("failed", "error")]
        if self.base != LEGACY_BASE and len(run.passed()) < len(failing) \
                and sum(bool(_PYTEST_INTERNALS.search(e)) for e in failing) > len(failing) / 2:
            raise PytestTooNew(f"{self.name}=={self.version}: its tests use pytest internals that "
                               f"{self.base[0]} no longer has: {failing[0][-200:]}")
        reasons = failure_reasons(run.errors, run.outcomes, self.name, self.compiled)
        uncollected = sum(n for k, n in reasons.items() if k.startswith("file does not collect"))
        blocker = sandbox_blocker(reasons, len(run.outcomes) + uncollected)
        if blocker:
            raise TaskError(f"{self.name}=={self.version}: not mined: {blocker}")
        if len(run.passed()) < MIN_PASSING:
            why = ", ".join(f"{k} ({n})" for k, n in reasons.most_common(5)) or "no failures recorded"
            raise TaskError(f"{self.name}=={self.version}: only {len(run.passed())} tests pass on the unmodified "
                            f"source, fewer than {MIN_PASSING}; failing: {why} (a test dependency the metadata "
                            f"does not name? add it to mine.PACKAGES):\n{run.log[-1500:]}")
        path.write_text(json.dumps({"key": key, "run": run.to_json()}))
        return run

    def sources(self, run: TestRun) -> dict[str, str]:
        """The package's own measured files: not test infrastructure, inside a package or src/."""
        test_dirs = {str(Path(t.split("::")[0]).parent) for t in run.outcomes}
        out = {}
        for rel in sorted(run.lines):
            p = Path(rel)
            if rel.startswith("..") or is_protected(rel, test_dirs) or p.suffix != ".py":
                continue
            if not (p.parts[0] == "src" or (self.source / p.parts[0] / "__init__.py").is_file()):
                continue
            out[rel] = (self.source / rel).read_text()
        return out

    # -- candidates -> tasks

    def run(self, report: MineReport, progress: bool = True) -> MineReport:
        """Mine into self.out, filling `report` as it goes (so a failure leaves what was learned)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        s = self.settings
        report.compiled = self.compiled
        report.requirements = {**report.requirements, "runtime": self.declared.runtime, "test": self.declared.test,
                               "origins": self.declared.origins, "skipped": self.declared.skipped,
                               "pins": self.resolution.pins, "dropped": self.resolution.dropped,
                               "pytest_args": self.env.pytest_args}
        self.out.mkdir(parents=True, exist_ok=True)
        rejected_file = self.state_dir / "rejected.json"
        rejected: dict[str, str] = json.loads(rejected_file.read_text()) if rejected_file.is_file() else {}
        baseline = self.baseline()
        report.requirements["pytest_args"] = self.env.pytest_args
        report.tests_total, report.tests_passing = len(baseline.outcomes), len(baseline.passed())
        report.failing = dict(failure_reasons(baseline.errors, baseline.outcomes, self.name, self.compiled)
                              .most_common())
        sources = self.sources(baseline)
        cov = coverage_map(baseline, sources)
        rng = random.Random(s.seed)
        features = feature_candidates(cov, len(baseline.passed()), s, rng, limit=4 * s.max_tasks)
        variants = variant_candidates(cov, sources, len(baseline.passed()), s, rng)
        quota = {"feature": s.max_tasks - s.variants, "variant": s.variants}
        if not features:  # a one-module package has no feature (they span two files): variants fill in
            quota = {"feature": 0, "variant": s.max_tasks}
        have = {"feature": 0, "variant": 0}
        image = None
        columns = (TextColumn("mine {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
            job = bar.add_task(f"{self.name}=={self.version}", total=s.max_tasks)
            for group, cands in (("feature", features), ("variant", variants)):
                for cand in cands:
                    if have[group] >= quota[group]:
                        break
                    tid = cand.task_id(self.name)
                    if (self.out / tid / "task.toml").is_file():
                        have[group] += 1
                        report.tasks.append(tid)
                        bar.advance(job)
                        continue
                    if tid in rejected:
                        continue
                    image = image or self.image()
                    try:
                        why = self.make_task(cand, tid, baseline, sources, cov, image)
                    except (TaskError, KeyError, ValueError, SyntaxError) as e:
                        why = f"{type(e).__name__}: {e}"[:500]
                    report.tried[tid] = why or "valid"
                    if why:
                        rejected[tid] = why
                        rejected_file.write_text(json.dumps(rejected, indent=1))
                        continue
                    have[group] += 1
                    report.tasks.append(tid)
                    report.new.append(tid)
                    bar.advance(job)
        report.rejected = rejected
        if report.tasks:
            self.record_in_suite()
        return report

    def make_task(self, cand: Candidate, tid: str, baseline: TestRun, sources: dict[str, str],
                  cov: dict, image: Image) -> str | None:
        """Build, measure and validate one candidate; write it to out/<tid>. Returns why not, or None."""
        s = self.settings
        broken = cand.broken(sources)
        for path, text in broken.items():
            compile(text, path, "exec")
        ws = image.workspace()
        try:
            for path, text in broken.items():
                (ws.root / path).write_text(text)
            run = run_tests(ws, self.test_paths, self.env.pytest_args)
        finally:
            ws.close()
        passing = baseline.passed()
        graded = [t for t in sorted(passing) if not any(fnmatch.fnmatch(t, p) for p in self.config.exclude)]
        failing = sorted(t for t in passing if run.outcomes.get(t) != "passed")
        still = [t for t in graded if run.outcomes.get(t) == "passed"]
        if not failing:
            return "no test fails on the broken workspace"
        if len(failing) > s.max_f2p_frac * len(passing):
            return f"{len(failing)} of {len(passing)} tests fail (more than {s.max_f2p_frac:.0%})"
        f2p = [t for t in failing if t in graded and run.failures.get(t, 0) <= s.max_failures]
        if not f2p:
            return f"no failing test can be graded (excluded, or more than {s.max_failures} failing subtests)"
        changed = set(broken)
        related = {t for fc in cov.values() if fc.path in changed for t in fc.tests}
        f2p_files = {t.split("::")[0] for t in f2p}
        p2p = [t for t in still if t in related or t.split("::")[0] in f2p_files] or still
        if len(p2p) > s.max_p2p:
            p2p = sorted(random.Random(tid).sample(p2p, s.max_p2p))
        for attempt in range(2):
            path = self.write_task(cand, tid, sources, broken, f2p, p2p, failing, self.state_dir / "staging" / tid)
            result = validate_task(Task.load(path), runs=s.runs, backend=self.backend)
            if result.valid:
                dest = self.out / tid
                shutil.rmtree(dest, ignore_errors=True)
                shutil.move(path, dest)
                return None
            flaky = set(result.flaky)
            shutil.rmtree(path, ignore_errors=True)
            if not flaky or attempt:
                return "; ".join(result.problems[:3])
            f2p = [t for t in f2p if t not in flaky]
            p2p = [t for t in p2p if t not in flaky]
            if not f2p:
                return "every fail-to-pass test is flaky"
        return "invalid"

    def write_task(self, cand: Candidate, tid: str, sources: dict[str, str], broken: dict[str, str],
                   f2p: list[str], p2p: list[str], failing: list[str], path: Path) -> Path:
        """The task directory: task.toml, break.patch, gold.patch, hidden_tests/ (every failing test hidden)."""
        shutil.rmtree(path, ignore_errors=True)
        hide: dict[str, set[str]] = {}
        for t in failing:
            file, _, rest = t.partition("::")
            hide.setdefault(file, set()).add(rest.split("[")[0].replace("::", "."))
        visible: dict[str, str | None] = {}
        originals: dict[str, str] = {}
        for file, quals in sorted(hide.items()):
            originals[file] = (self.source / file).read_text()
            try:
                visible[file] = remove_tests(originals[file], quals)
            except KeyError:  # e.g. inherited test methods: hide the whole file
                visible[file] = None
            hidden = path / HIDDEN_DIR / file
            hidden.parent.mkdir(parents=True, exist_ok=True)
            hidden.write_text(originals[file])
        before = {p: sources[p] for p in broken} | originals
        after = dict(broken) | {f: v for f, v in visible.items() if v is not None}
        break_patch = tree_diff(before, after)
        gold = tree_diff(broken, {p: sources[p] for p in broken})
        (path / BREAK_PATCH).write_text(break_patch)
        (path / GOLD_PATCH).write_text(gold)
        instruction = cand.instruction()
        lines, files = patch_stats(gold)
        Task(path, TaskSpec(
            id=tid, instruction=instruction, created=CREATED,
            source=self.origin,
            tests=TaskTests(fail_to_pass=f2p, pass_to_pass=p2p),
            environment=self.env,
            stats=Stats(gold_lines_changed=lines, gold_files_changed=files, instruction_chars=len(instruction)),
        )).save()
        return path

    def record_in_suite(self) -> None:
        """Create or update out/suite.toml: the miner's settings and this package's pin."""
        file = self.out / SUITE_FILE
        if file.is_file():
            spec = SuiteSpec.model_validate(tomllib.loads(file.read_text()))
        else:
            spec = SuiteSpec(name=self.out.name, version="1", description="Tasks mined from PyPI sdists by "
                             "`opencomposer tasks mine` (see docs/ocbench.md).")
        settings = asdict(self.settings)
        settings["lines"] = "{}-{}".format(*self.settings.lines)
        packages = sorted(set(spec.miner.get("packages", [])) | {f"{self.name}=={self.version}"})
        spec.miner = {"miner_version": MINER_VERSION, **settings, "packages": packages}
        Suite(self.out, spec, []).save()


def mine(out: Path, *, package: str | None = None, sdist: Path | None = None, source: Path | None = None,
         settings: Settings | None = None, backend: Backend | None = None, find_links: Path | None = None,
         progress: bool = True) -> MineReport:
    """Mine one project into task dirs under `out`: NAME==VERSION from PyPI, a local sdist, or a
    local project directory (`source`, recorded by path, tree hash and git commit)."""
    if sum(x is not None for x in (package, sdist, source)) != 1:
        raise TaskError("give exactly one of --package NAME==VERSION, --sdist PATH or --source DIR")
    backend = backend or default_backend()
    if source is not None:
        root = Path(source).resolve()
        if not root.is_dir():
            raise TaskError(f"--source {source}: not a directory")
        name, version = project_identity(root)
        files = tree_files(root)
        if not files:
            raise TaskError(f"--source {source}: no files (an empty directory, or everything is git-ignored)")
        origin = Source(kind="local", package=name, version=version, sha256=tree_hash(root, files),
                        path=str(root), commit=git_commit(root))
        layer = local_source_layer(root, name, version, origin.sha256)
    else:
        name = None
        if package:
            name = package.split("==")[0].strip()
            sdist = fetch_sdist(package, backend)
        elif not Path(sdist).is_file():
            raise TaskError(f"--sdist {sdist}: no such file")
        meta_name, version = sdist_metadata(Path(sdist))
        sha = hashlib.sha256(Path(sdist).read_bytes()).hexdigest()
        origin = Source(kind="pypi", package=name or meta_name, version=version, sha256=sha)
        layer = source_layer(origin.package, version, sha, sdist=Path(sdist), backend=backend)
    report = MineReport(origin.package, origin.version, source=origin.model_dump(exclude_none=True))
    start = time.monotonic()
    try:
        try:
            miner = Miner(layer, origin, Path(out), settings or Settings(), backend, find_links=find_links)
            return miner.run(report, progress=progress)
        except PytestTooNew as e:
            report.requirements["retried"] = f"{e}; mined with {LEGACY_BASE[0]} instead"
            miner = Miner(layer, origin, Path(out), settings or Settings(), backend, find_links=find_links,
                          base=LEGACY_BASE)
            return miner.run(report, progress=progress)
    except TaskError as e:
        report.error = str(e)
        raise
    finally:
        report.duration_s = round(time.monotonic() - start, 1)
        report.write(Path(out))
