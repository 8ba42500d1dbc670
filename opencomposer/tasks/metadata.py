"""What a Python project says it needs: runtime and test requirements, read from its files.

    declared_requirements(root, name) -> Declared(runtime, test, origins)

Read, never run (the host never executes a package's code):

    runtime   PKG-INFO Requires-Dist (no extra), pyproject [project].dependencies (and a
              setuptools `dynamic` file), *.egg-info/requires.txt, setup.cfg
              install_requires, setup.py's install_requires when it is a literal (ast)
    test      extras, dependency groups, hatch environments and requirements files whose
              name says test (test, tests, testing, hatch-test), setup.py/setup.cfg
              tests_require, tox.ini's [testenv] deps and extras; when the project names none of
              those: every extra plus its dev extras/groups/files

Markers are evaluated for the sandbox's Python (the one task venvs are built with) and
dropped; self-references (`pkg[yaml]` in a dev extra) expand to that extra's requirements.
Exact pins from requirements files (`pytest==7.4.0`: a lock of somebody's dev env, not a
constraint) become bare names; so do Poetry's version strings, which are not PEP 508.
Test requirements drop the tools no test imports (linters, docs, packaging) and what the
miner's own venv pins (pytest, coverage); resolving and pinning happens in deps.py.

Left out: requirements computed by running setup.py, and build-time requirements (the
source tree is put on sys.path, never built).
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import json
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from email.parser import Parser
from functools import lru_cache
from pathlib import Path

from packaging.markers import InvalidMarker, Marker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from opencomposer.tasks.smoke import REQUIREMENTS as PYTEST_REQUIREMENTS

BASE_REQUIREMENTS = [*PYTEST_REQUIREMENTS, "coverage==7.17.5"]
"""Every mined task's venv: pytest (with its dependencies) and coverage, pinned; declared test
requirements naming one of these are left to the pin."""

TEST_NAMES = {"test", "tests", "testing", "hatch-test", "pytest", "unittest", "unittests"}
DEV_NAMES = {"dev", "develop", "development", "all", "ci"}
TOOLS = {
    "tox", "nox", "virtualenv", "pre-commit", "black", "ruff", "flake8", "pylint", "isort", "mypy", "pyright",
    "pyflakes", "pycodestyle", "pydocstyle", "autopep8", "yapf", "bandit", "codespell", "sphinx", "furo",
    "mkdocs", "twine", "build", "wheel", "setuptools", "setuptools-scm", "check-manifest", "bumpversion",
    "bump2version", "bump-my-version", "pyupgrade", "flynt", "towncrier", "readme-renderer", "pip-tools",
    "codecov", "coveralls", "ipython", "ipdb", "pdbpp", "jupyter", "pip", "hatch", "flit", "poetry",
    "coverage", "pytest-cov", "pytest-randomly", "pytest-xdist", "pytest-sugar", "pytest-clarity",
    "pytest-pretty", "pytest-github-actions-annotate-failures", "pytest-codspeed", "docutils-stubs",
    "pytest-ruff", "pytest-mypy", "pytest-checkdocs", "pytest-enabler", "pytest-flake8", "pytest-black",
    "pytest-isort", "pytest-pylint", "pytest-flakes", "pytest-pycodestyle", "pytest-codestyle",
}
"""Never needed by a test run: linters, docs, packaging; pytest plugins that add lint items as
tests (pytest-ruff, -mypy, -checkdocs) or turn on others from the project's config
(pytest-enabler: xdist, whose workers the grader's report cannot see); pytest-randomly would
reorder the run; coverage is pinned by the miner."""
TOOL_PREFIXES = ("sphinx", "mkdocs", "types-", "flake8-", "mypy-", "myst-", "pylint-", "ruff-")
_SCRIPT = ("import json, os, platform, sys; i = sys.implementation; print(json.dumps({"
           "'implementation_name': i.name, 'implementation_version': '.'.join(map(str, i.version[:3])), "
           "'os_name': os.name, 'platform_machine': platform.machine(), 'platform_release': platform.release(), "
           "'platform_system': platform.system(), 'platform_version': platform.version(), "
           "'python_full_version': platform.python_version(), 'platform_python_implementation': "
           "platform.python_implementation(), 'python_version': '.'.join(platform.python_version_tuple()[:2]), "
           "'sys_platform': sys.platform}))")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@lru_cache(maxsize=1)
def sandbox_environment() -> dict[str, str]:
    """PEP 508 marker values of the Python that task venvs are built with."""
    from opencomposer.tasks.build import SYSTEM_PYTHON

    out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", _SCRIPT], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@dataclass
class Declared:
    """A project's requirements as PEP 508 strings without markers, and where each list came from."""

    runtime: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    """e.g. "PKG-INFO Requires-Dist", "pyproject [dependency-groups] test", "requirements-test.txt"."""
    skipped: list[str] = field(default_factory=list)
    """Requirement strings left out, each with why (unparseable, a URL, a tool)."""


class _Reader:
    """Collects requirements from every file of one project; see the module docstring."""

    def __init__(self, root: Path, name: str):
        self.root, self.name = root, norm(name)
        self.env = sandbox_environment()
        self.runtime: dict[str, list[str]] = {}  # origin -> requirement strings (markers kept)
        self.extras: dict[str, dict[str, list[str]]] = {}  # origin -> extra -> strings
        self.tests: dict[str, list[str]] = {}  # origin -> strings that only tests need
        self.dev: dict[str, list[str]] = {}
        self.files_named: set[str] = set()
        self.tox_extras: set[str] = set()  # tox's [testenv] extras: what its test runs install
        self.skipped: list[str] = []

    # -- the files

    def pkg_info(self) -> None:
        file = self.root / "PKG-INFO"
        if not file.is_file():
            return
        meta = Parser().parsestr(file.read_text(errors="replace"))
        runtime, extras = [], {}
        for line in meta.get_all("Requires-Dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                self.skipped.append(f"{line} (PKG-INFO: not PEP 508)")
                continue
            extra = _extra_of(req.marker)
            (extras.setdefault(extra, []) if extra else runtime).append(line)
        self._add("PKG-INFO Requires-Dist", runtime, extras)

    def egg_info(self) -> None:
        for file in sorted(self.root.glob("*.egg-info/requires.txt")) + sorted(self.root.glob("src/*.egg-info/requires.txt")):
            runtime, extras, section = [], {}, ""
            for line in file.read_text(errors="replace").splitlines():
                line = line.strip()
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1]
                    continue
                if not line:
                    continue
                extra, _, marker = section.partition(":")
                req = f"{line}; {marker}" if marker else line
                (extras.setdefault(extra, []) if extra else runtime).append(req)
            self._add(str(file.relative_to(self.root)), runtime, extras)

    def pyproject(self) -> None:
        file = self.root / "pyproject.toml"
        if not file.is_file():
            return
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as e:
            self.skipped.append(f"pyproject.toml (invalid TOML: {e})")
            return
        project = data.get("project", {})
        runtime = list(project.get("dependencies", []))
        dynamic = data.get("tool", {}).get("setuptools", {}).get("dynamic", {})
        for key, target in (("dependencies", runtime), ("optional-dependencies", None)):
            files = dynamic.get(key, {})
            if key == "dependencies" and isinstance(files, dict):
                for f in _as_list(files.get("file")):
                    target.extend(self.requirements_file(f))
        extras = {k: list(v) for k, v in project.get("optional-dependencies", {}).items()}
        for extra, spec in dynamic.get("optional-dependencies", {}).items():
            if isinstance(spec, dict):
                extras[extra] = [r for f in _as_list(spec.get("file")) for r in self.requirements_file(f)]
        self._add("pyproject [project]", runtime, extras)
        groups = data.get("dependency-groups", {})
        groups |= {k: v for k, v in data.get("tool", {}).get("pdm", {}).get("dev-dependencies", {}).items()}
        for group in groups:
            self._test_or_dev(f"pyproject [dependency-groups] {group}", group, _group(groups, group, set()))
        for env, spec in data.get("tool", {}).get("hatch", {}).get("envs", {}).items():
            if isinstance(spec, dict) and spec.get("dependencies"):
                self._test_or_dev(f"pyproject [tool.hatch.envs] {env}", env, list(spec["dependencies"]))
        poetry = data.get("tool", {}).get("poetry", {})
        if poetry:
            self._add("pyproject [tool.poetry]", _poetry(poetry.get("dependencies", {})), {})
            for group, spec in poetry.get("group", {}).items():
                self._test_or_dev(f"pyproject [tool.poetry.group] {group}", group, _poetry(spec.get("dependencies", {})))
            if poetry.get("dev-dependencies"):
                self._test_or_dev("pyproject [tool.poetry.dev-dependencies]", "dev", _poetry(poetry["dev-dependencies"]))

    def setup_cfg(self) -> None:
        file = self.root / "setup.cfg"
        if not file.is_file():
            return
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(file.read_text(errors="replace"))
        except configparser.Error as e:
            self.skipped.append(f"setup.cfg (unreadable: {e})")
            return
        opts = cfg["options"] if cfg.has_section("options") else {}
        extras = {k: _lines(v) for k, v in cfg["options.extras_require"].items()} \
            if cfg.has_section("options.extras_require") else {}
        self._add("setup.cfg", _lines(opts.get("install_requires", "")), extras)
        if opts.get("tests_require"):
            self.tests["setup.cfg tests_require"] = _lines(opts["tests_require"])

    def setup_py(self) -> None:
        file = self.root / "setup.py"
        if not file.is_file():
            return
        try:
            tree = ast.parse(file.read_text(errors="replace"))
        except SyntaxError:
            self.skipped.append("setup.py (does not parse)")
            return
        names = {}  # module-level NAME = literal, for install_requires=REQUIRES
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                names[node.targets[0].id] = node.value
        for node in ast.walk(tree):
            func = getattr(node, "func", None)
            if not isinstance(node, ast.Call) or getattr(func, "id", getattr(func, "attr", None)) != "setup":
                continue
            kw = {k.arg: _literal(k.value, names) for k in node.keywords if k.arg}
            runtime = kw.get("install_requires")
            extras = kw.get("extras_require")
            self._add("setup.py", runtime if isinstance(runtime, list) else [],
                      extras if isinstance(extras, dict) else {})
            if isinstance(kw.get("tests_require"), list):
                self.tests["setup.py tests_require"] = kw["tests_require"]

    def requirement_files(self) -> None:
        cands = sorted({*self.root.glob("*requirements*.txt"), *self.root.glob("requirements/*.txt"),
                        *self.root.glob("requirements/*.in"), *self.root.glob("*requirements*.in"),
                        *self.root.glob("test*/requirements*.txt")})
        for file in cands:
            rel = file.relative_to(self.root).as_posix()
            words = set(re.split(r"[^a-z]+", rel.lower()))
            if words & TEST_NAMES:
                self.tests[rel] = self.requirements_file(rel)
            elif words & DEV_NAMES:
                self.dev[rel] = self.requirements_file(rel)

    def tox_ini(self) -> None:
        file = self.root / "tox.ini"
        if not file.is_file():
            return
        cfg = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            cfg.read_string(file.read_text(errors="replace"))
        except configparser.Error:
            return
        if cfg.has_option("testenv", "deps"):
            reqs = []
            for line in _lines(cfg.get("testenv", "deps")):
                line = re.sub(r"^[\w,-]+:\s*", "", line)  # factor-conditional lines: "py3: foo"
                if line.startswith("-r"):
                    reqs.extend(self.requirements_file(line[2:].strip().replace("{toxinidir}/", "")))
                elif "{" not in line:
                    reqs.append(line)
            self.tests["tox.ini [testenv] deps"] = reqs
        if cfg.has_option("testenv", "extras"):
            self.tox_extras = {norm(e.strip()) for line in _lines(cfg.get("testenv", "extras"))
                               for e in line.split(",") if e.strip() and "{" not in e and ":" not in e}

    def requirements_file(self, rel: str, depth: int = 0) -> list[str]:
        """A pip requirements file's requirements: `-r` followed inside the tree, options and paths
        skipped, exact pins loosened to bare names (a lock file is not a constraint)."""
        file = (self.root / rel).resolve()
        if depth > 5 or not file.is_file() or not file.is_relative_to(self.root.resolve()):
            return []
        self.files_named.add(rel)
        out = []
        for line in file.read_text(errors="replace").splitlines():
            line = line.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith(("-r", "--requirement", "-c", "--constraint")):
                target = line.split(None, 1)[1] if " " in line else line[2:]
                if line.startswith(("-r", "--requirement")):
                    out.extend(self.requirements_file((file.parent / target.strip()).relative_to(
                        self.root.resolve()).as_posix(), depth + 1))
                continue
            if line.startswith(("-", ".", "/")) or "://" in line:
                continue
            out.append(re.sub(r"\s*===?\s*[^;,\s]+(?=\s*(;|$))", "", line))
        return out

    # -- sorting them out

    def _add(self, origin: str, runtime: list[str], extras: dict[str, list[str]]) -> None:
        if runtime:
            self.runtime[origin] = [str(r) for r in runtime]
        if extras:
            self.extras[origin] = {norm(k): [str(r) for r in v] for k, v in extras.items()}

    def _test_or_dev(self, origin: str, group: str, reqs: list[str]) -> None:
        if norm(group) in TEST_NAMES:
            self.tests[origin] = reqs
        elif norm(group) in DEV_NAMES or norm(group) == "default":
            self.dev[origin] = reqs

    def keep(self, line: str, extra: str = "") -> list[str]:
        """`line` without its marker if the marker holds in the sandbox (self-extras expanded)."""
        try:
            req = Requirement(line)
        except InvalidRequirement:
            self.skipped.append(f"{line} (not PEP 508)")
            return []
        if req.url:
            self.skipped.append(f"{line} (a URL requirement: not reproducible from a pin)")
            return []
        if req.marker is not None:
            try:
                if not req.marker.evaluate(self.env | {"extra": extra}):
                    return []
            except (InvalidMarker, UndefinedEnvironmentName):
                self.skipped.append(f"{line} (marker not understood)")
                return []
        if norm(req.name) == self.name:
            return [r for e in req.extras for r in self.extra(e)]
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        return [f"{req.name}{extras}{req.specifier}"]

    def extra(self, name: str, seen: set | None = None) -> list[str]:
        seen = seen if seen is not None else set()
        if norm(name) in seen:
            return []
        seen.add(norm(name))
        out = []
        for origin, extras in self.extras.items():
            for line in extras.get(norm(name), []):
                out.extend(self.keep(line, norm(name)))
        return out

    def result(self) -> Declared:
        d = Declared(skipped=self.skipped)
        first_runtime = next(iter(self.runtime), None)
        for origin, reqs in self.runtime.items():
            # PKG-INFO is what the build backend resolved from the rest: when it has any, trust it
            if origin != first_runtime and first_runtime == "PKG-INFO Requires-Dist":
                continue
            d.origins.append(origin)
            for line in reqs:
                d.runtime.extend(self.keep(line))
        test_extras = sorted({e for ex in self.extras.values() for e in ex if e in TEST_NAMES | self.tox_extras})
        if test_extras or self.tests:
            chosen = [(f"extra {e}", self.extra(e)) for e in test_extras]
            chosen += [(o, [r for line in reqs for r in self.keep(line)]) for o, reqs in self.tests.items()]
        else:  # nothing says "test": every extra and the dev tooling, minus the tools
            chosen = [(f"extra {e}", self.extra(e)) for e in sorted({e for ex in self.extras.values() for e in ex})]
            chosen += [(o, [r for line in reqs for r in self.keep(line)]) for o, reqs in self.dev.items()]
        base = {norm(r.split("==")[0]) for r in BASE_REQUIREMENTS}
        for origin, reqs in chosen:
            d.origins.append(origin)
            for r in reqs:
                name = norm(Requirement(r).name)
                if name in TOOLS or name.startswith(TOOL_PREFIXES) or name in base:
                    continue
                d.test.append(r)
        d.runtime = _unique(d.runtime)
        runtime = {_canon(r) for r in d.runtime}
        d.test = [r for r in _unique(d.test) if _canon(r) not in runtime]
        return d


def declared_requirements(root: Path, name: str) -> Declared:
    """Runtime and test requirements of the project unpacked at `root`; see the module docstring."""
    r = _Reader(Path(root), name)
    for step in (r.pkg_info, r.pyproject, r.setup_cfg, r.setup_py, r.egg_info, r.requirement_files, r.tox_ini):
        step()
    return r.result()


def project_identity(root: Path) -> tuple[str, str]:
    """(name, version) of a project directory: PKG-INFO, pyproject, setup.cfg, setup.py literals;
    the directory's name and "0" when none says (a version computed at build time, e.g. from git)."""
    root = Path(root)
    name = version = None
    if (root / "PKG-INFO").is_file():
        meta = Parser().parsestr((root / "PKG-INFO").read_text(errors="replace"))
        name, version = meta.get("Name"), meta.get("Version")
    if (root / "pyproject.toml").is_file() and not (name and version):
        with contextlib.suppress(tomllib.TOMLDecodeError):
            data = tomllib.loads((root / "pyproject.toml").read_text())
            for table in (data.get("project", {}), data.get("tool", {}).get("poetry", {})):
                name, version = name or table.get("name"), version or table.get("version")
    if (root / "setup.cfg").is_file() and not (name and version):
        cfg = configparser.ConfigParser(interpolation=None)
        with contextlib.suppress(configparser.Error):
            cfg.read_string((root / "setup.cfg").read_text(errors="replace"))
            if cfg.has_section("metadata"):
                name, version = name or cfg["metadata"].get("name"), version or cfg["metadata"].get("version")
    if (root / "setup.py").is_file() and not (name and version):
        with contextlib.suppress(SyntaxError):
            for node in ast.walk(ast.parse((root / "setup.py").read_text(errors="replace"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "setup":
                    kw = {k.arg: _literal(k.value, {}) for k in node.keywords if k.arg}
                    name = name or (kw.get("name") if isinstance(kw.get("name"), str) else None)
                    version = version or (kw.get("version") if isinstance(kw.get("version"), str) else None)
    if version and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", version):
        version = None  # "attr: pkg.__version__" and the like
    return name or Path(root).resolve().name, version or "0"


# ---------------------------------------------------------------- helpers


def _extra_of(marker: Marker | None) -> str:
    """The extra a Requires-Dist marker selects ("" for none): `extra == "test"` anywhere in it."""
    m = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", str(marker or ""))
    return norm(m.group(1)) if m else ""


def _as_list(v) -> list:
    return [v] if isinstance(v, str) else list(v or [])


def _lines(text: str) -> list[str]:
    return [s.strip() for s in text.splitlines() if s.strip() and not s.strip().startswith("#")]


def _group(groups: dict, name: str, seen: set) -> list[str]:
    """A PEP 735 dependency group with its {include-group = ...} entries expanded."""
    if name in seen:
        return []
    seen.add(name)
    out = []
    for item in groups.get(name, []):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and "include-group" in item:
            out.extend(_group(groups, item["include-group"], seen))
    return out


def _poetry(deps: dict) -> list[str]:
    """Poetry's {name: constraint} as bare names: its ^ and ~ constraints are not PEP 508."""
    return [name for name, spec in deps.items() if name.lower() != "python"
            and not (isinstance(spec, dict) and ("path" in spec or "git" in spec or "url" in spec))]


def _literal(node: ast.AST, names: dict):
    """ast.literal_eval, following one module-level name (install_requires=REQUIRES)."""
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _canon(req: str) -> str:
    """PyYAML and pyyaml, typing_extensions and typing-extensions: one requirement."""
    return re.sub(r"[-_.]+", "-", req).lower()


def _unique(items: list[str]) -> list[str]:
    seen, out = set(), []
    for r in items:
        if _canon(r) not in seen:
            seen.add(_canon(r))
            out.append(r)
    return out
