"""The package's imports go down the layers of ARCHITECTURE.md ("Layers") and never form a cycle.

The checker reads every module of `opencomposer` with `ast`, so it sees what Python would
import, lazy imports inside functions and imports under TYPE_CHECKING included (a lazy or a
type-only import hides a cycle from the interpreter, not from a reader). It reports three kinds of fault:
- a cycle between modules;
- a cycle between parts (engine <-> harness, pretrain <-> rl, ...), even when no two modules
  form one: two parts on the same layer may use each other only one way;
- an import from a lower layer to a higher one.

An import of `a.b.c` is an edge to the module `a.b.c` only: a package's `__init__` runs too,
but counting it would turn every package that re-exports its own modules into a cycle.
`from a.b import name` is an edge to `a.b.name` when that is a module, else to `a.b`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "opencomposer"

# ARCHITECTURE.md's layers, top first. Each entry names the parts of `opencomposer` on that
# layer: a part is a sub-package or a top-level module. `*.cli` modules of each part are
# command wiring and sit on the top layer with the main CLI.
LAYERS: list[tuple[str, ...]] = [
    ("cli", "pipeline", "pipeline_report", "demo"),  # top: wiring only
    ("pretrain", "rl"),
    ("training",),  # shared training utilities (packing, LR schedule, metrics) below both
    ("eval",),
    ("tasks",),
    ("harness",),
    ("engine",),
    ("sandbox", "model"),
    ("errors", "device", "config", "__init__"),  # config helpers, the package's own docstring
]


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(src: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body), read with `ast`."""
    files = {module_name(p, src): p for p in sorted((src / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.add(_known(alias.name, files))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in files else _known(base, files))
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def _known(name: str, files: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a module of the package ('' for outside ones)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in files:
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """`opencomposer.rl.trainer` -> `rl`; `opencomposer.config` -> `config`; sub-CLIs -> `cli`."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if len(parts) > 1 and parts[-1] == "cli":
        return "cli"
    return parts[0]


def layer_of(part: str) -> int:
    """0 is the top layer."""
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"part {part!r} is in no layer: add it to LAYERS (and to ARCHITECTURE.md)")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def faults(graph: dict[str, set[str]]) -> list[str]:
    """Every module cycle, part cycle and upward import in `graph`, as readable lines."""
    edges = {(a, b) for a, bs in graph.items() for b in bs}
    modules: dict[str, set[str]] = {m: set() for m in graph}
    parts: dict[str, set[str]] = {}
    for a, b in edges:
        modules[a].add(b)
        if part_of(a) != part_of(b):
            parts.setdefault(part_of(a), set()).add(part_of(b))
    out = [f"module cycle: {' <-> '.join(c)}" for c in cycles(modules)]
    out += [f"part cycle: {' <-> '.join(c)}" for c in cycles(parts)]
    for a, b in sorted(edges):
        if layer_of(part_of(a)) > layer_of(part_of(b)):
            out.append(f"upward import: {a} ({part_of(a)}) imports {b} ({part_of(b)})")
    return out


@functools.cache
def _package_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(t) for m, t in import_graph(ROOT).items()}


def todays_graph() -> dict[str, set[str]]:
    """A fresh, mutable copy of the package's graph (parsed once per test session)."""
    return {m: set(t) for m, t in _package_graph().items()}


def test_package_imports_follow_the_layers():
    assert faults(todays_graph()) == []


def test_every_part_is_in_a_layer():
    for mod in todays_graph():
        layer_of(part_of(mod))


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_catches_a_planted_lazy_module_cycle(tmp_path):
    _write(tmp_path, {
        "__init__.py": "",
        "engine/__init__.py": "from .server import app\n",  # relative to the package itself
        "engine/server.py": "from . import client\n",
        # Lazy and relative: the interpreter would never complain about this one.
        "engine/client.py": "def f():\n    from .server import app\n",
    })
    graph = import_graph(tmp_path)
    assert graph["opencomposer.engine"] == {"opencomposer.engine.server"}
    assert graph["opencomposer.engine.client"] == {"opencomposer.engine.server"}
    assert faults(graph) == ["module cycle: opencomposer.engine.client <-> opencomposer.engine.server"]


def test_checker_catches_a_part_cycle_and_an_upward_import(tmp_path):
    # engine -> harness is upward; harness -> engine is fine alone; together they are a part
    # cycle although no two modules import each other.
    _write(tmp_path, {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/server.py": "import opencomposer.harness.chat\n",
        "harness/__init__.py": "",
        "harness/chat.py": "",
        "harness/agent.py": "from opencomposer.engine import server\n",
    })
    assert faults(import_graph(tmp_path)) == [
        "part cycle: engine <-> harness",
        "upward import: opencomposer.engine.server (engine) imports opencomposer.harness.chat (harness)",
    ]


def test_same_layer_parts_may_import_one_way(tmp_path):
    _write(tmp_path, {
        "__init__.py": "",
        "rl/__init__.py": "",
        "rl/trainer.py": "",
        "pretrain/__init__.py": "",
        "pretrain/sft.py": "from opencomposer.rl.trainer import Trainer\n",
    })
    assert faults(import_graph(tmp_path)) == []
    _write(tmp_path, {"rl/trainer.py": "from opencomposer.pretrain import sft\n"})
    assert faults(import_graph(tmp_path)) == [
        "module cycle: opencomposer.pretrain.sft <-> opencomposer.rl.trainer",
        "part cycle: pretrain <-> rl",
    ]


def test_checker_catches_todays_cycles_if_they_came_back():
    # The cycles that issue 17 cut, brought back into today's graph by the edges that made them.
    came_back = [
        ([("opencomposer.engine.server", "opencomposer.harness.agent")], "part cycle: engine <-> harness"),
        ([("opencomposer.training.packing", "opencomposer.rl.buffer")], "upward import"),
        ([("opencomposer.pretrain.sft", "opencomposer.rl.trainer"),
          ("opencomposer.rl.trainer", "opencomposer.pretrain.train")], "part cycle: pretrain <-> rl"),
        ([("opencomposer.eval.report", "opencomposer.eval.run")], "module cycle"),
        ([("opencomposer.pipeline_report", "opencomposer.pipeline")], "module cycle"),
        ([("opencomposer.config", "opencomposer.rl.config")], "upward import"),
        ([("opencomposer.rl.orchestrator", "opencomposer.rl.ray_runner")], "module cycle"),
        ([("opencomposer.pipeline", "opencomposer.cli")], "part cycle: cli <-> pipeline"),
    ]
    for edges, fault in came_back:
        graph = todays_graph()
        for a, b in edges:
            assert a in graph and b in graph, (a, b)
            graph[a].add(b)
        assert any(line.startswith(fault) for line in faults(graph)), edges
