"""Generated smoke tasks: tiny projects with one behaviour removed or broken.

The projects live in smoke_projects/<name>/ (a package of 1-3 modules and a tests/ dir with
one test per function, `test_<qualname>`). A *mutation* breaks one function:

    remove_body       the body after the docstring becomes `raise NotImplementedError`
                      (every public function or method with a docstring gets one)
    flip_operator,    hand-written (old -> new) text replacements inside one function,
    remove_condition, listed in MUTATIONS with the instruction's wording of the symptom
    wrong_value

A candidate task is one mutation, or (for larger families) two mutations of different
functions of one project. For each candidate the project's tests are run in the sandbox on the broken tree:
the tests that fail become fail-to-pass (hidden: removed from the visible test files, whose
full versions go to hidden_tests/), the rest pass-to-pass; a mutation no test notices is
skipped. The gold patch is the diff from the broken sources back to the originals.

API:

    generate_tasks(n, seed, out_dir, *, backend=None) -> list[Path]

writes n task directories (deterministic for a given seed and library: candidates are
shuffled with random.Random(seed), then taken round-robin across projects, singles before
pairs; 96 singles and 224 pairs are available) and a suite.toml.
`python -m opencomposer.tasks.smoke --n 16 --seed 0 --out tasks/suites/smoke` regenerates
the committed suite.

Left out: renaming identifiers or reshuffling code per seed (variety comes from the
project x function x mutation grid), and multi-file features like ocbench's (the miner's job).
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opencomposer.errors import TaskError
from opencomposer.sandbox.base import Backend
from opencomposer.tasks.task import (GOLD_PATCH, HIDDEN_DIR, WORKSPACE_DIR, Environment, Source, Stats,
                                     Suite, SuiteSpec, Task, TaskSpec, TaskTests, patch_stats, tree_diff)

PROJECTS_DIR = Path(__file__).parent / "smoke_projects"
REQUIREMENTS = ["pytest==9.2.0", "iniconfig==2.3.1", "packaging==26.4", "pluggy==1.7.0", "pygments==2.21.0"]
"""The one venv every generated task shares (pytest and its dependencies, pinned)."""
GENERATOR_VERSION = "1"
CREATED = "2026-01-01T00:00:00Z"
PYPROJECT = '[project]\nname = "{name}"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n\n' \
            '[tool.pytest.ini_options]\npythonpath = ["."]\n'


@dataclass(frozen=True)
class Mutation:
    """One way to break one function of a smoke project."""

    project: str
    path: str
    """Module path relative to the project root, e.g. "mathkit/numbers.py"."""
    qualname: str
    """Function or Class.method."""
    kind: str
    old: str = ""
    """Text inside the function replaced by `new` (must occur exactly once there)."""
    new: str = ""
    says: str = ""
    """The instruction; "{f}" becomes "`qualname` in path"."""


def _m(project: str, module: str, qualname: str, kind: str, old: str, new: str, says: str) -> Mutation:
    return Mutation(project, f"{project}/{module}.py", qualname, kind, old, new, says)


MUTATIONS = [
    _m("mathkit", "numbers", "clamp", "flip_operator", "x > hi", "x < hi", "{f} returns hi for values inside the range. Fix it."),
    _m("mathkit", "numbers", "clamp", "remove_condition", "    if x < lo:\n        return lo\n", "", "{f} ignores the lower bound. Fix it."),
    _m("mathkit", "numbers", "gcd", "remove_condition", "a, b = abs(a), abs(b)", "a, b = a, b", "{f} can return a negative number. Fix it."),
    _m("mathkit", "numbers", "is_prime", "flip_operator", "i * i <= n", "i * i < n", "{f} says 49 is prime. Fix it."),
    _m("mathkit", "numbers", "mean", "remove_condition", '    if not xs:\n        raise ValueError("mean of an empty sequence")\n', "",
       "{f} should raise ValueError on an empty sequence."),
    _m("textkit", "words", "words", "wrong_value", "text.lower()", "text", "{f} drops capital letters. Fix it."),
    _m("textkit", "words", "top_words", "flip_operator", "(-kv[1], kv[0])", "(kv[1], kv[0])", "{f} lists the rarest words first."),
    _m("textkit", "slug", "slugify", "remove_condition", "(p for p in parts if p)", "(p for p in parts)", "{f} leaves stray hyphens at the ends."),
    _m("textkit", "slug", "camel_to_snake", "remove_condition", '    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)\n', "    s = name\n",
       "{f} mangles acronyms like HTTPServer."),
    _m("roman", "convert", "to_roman", "flip_operator", "n >= value", "n > value", "{f} gets 10, 1000 and friends wrong."),
    _m("roman", "convert", "to_roman", "remove_condition", '    if not 1 <= n <= 3999:\n        raise ValueError(f"{n} is outside 1..3999")\n', "",
       "{f} must reject numbers outside 1..3999."),
    _m("roman", "convert", "from_roman", "flip_operator", "_DIGITS[s[i + 1]] > v", "_DIGITS[s[i + 1]] < v", "{f} misreads IV, XC and the like."),
    _m("shapes", "geometry", "Rect.contains", "flip_operator", "self.x <= px", "self.x < px", "{f} says points on the left edge are outside."),
    _m("shapes", "geometry", "Rect.intersects", "flip_operator", "self.x < other.x + other.w", "self.x <= other.x + other.w",
       "{f}: rectangles that only touch should not intersect."),
    _m("shapes", "geometry", "Rect.union_box", "wrong_value", "y1 = max(", "y1 = min(", "{f} returns a box that is too short."),
    _m("structures", "stack", "Stack.pop", "remove_condition", '        if not self._items:\n            raise EmptyError("pop from an empty stack")\n', "",
       "{f} should raise EmptyError when the stack is empty."),
    _m("structures", "fifo", "Queue.get", "remove_condition", "        if not len(self._out):\n            while len(self._in):\n"
       "                self._out.push(self._in.pop())\n", "        while len(self._in):\n            self._out.push(self._in.pop())\n",
       "{f} returns items out of order when puts and gets interleave."),
    _m("intervals", "ops", "overlaps", "flip_operator", "a[0] <= b[1]", "a[0] < b[1]", "{f}: intervals that touch at one point overlap."),
    _m("intervals", "ops", "merge", "wrong_value", "max(out[-1][1], end)", "end", "{f} shrinks an interval that contains the next one."),
    _m("intervals", "ops", "merge", "remove_condition", "sorted(intervals)", "intervals", "{f} is wrong for unsorted input."),
    _m("bank", "account", "Account.withdraw", "remove_condition", "        if amount > self.balance:\n"
       '            raise InsufficientFunds(f"{self.owner}: balance {self.balance} < {amount}")\n', "",
       "{f} lets the balance go negative."),
    _m("bank", "account", "Account.withdraw", "flip_operator", "amount > self.balance", "amount >= self.balance",
       "{f} refuses to withdraw the whole balance."),
    _m("bank", "account", "Account.deposit", "remove_condition", '        if amount <= 0:\n            raise ValueError("deposit must be positive")\n', "",
       "{f} accepts zero and negative amounts."),
    _m("bank", "transfers", "apply_interest", "remove_condition", "    if interest > 0:\n        account.deposit(interest)\n",
       "    account.deposit(interest)\n", "{f} crashes when the interest rounds down to zero."),
    _m("rle", "codec", "encode", "wrong_value", '{j - i}{text[i]}', '{j - i - 1}{text[i]}', "{f} writes run lengths one too small."),
    _m("rle", "codec", "decode", "wrong_value", "count += ch", "count = ch", "{f} breaks on runs of ten or more."),
    _m("temperature", "convert", "f_to_c", "wrong_value", "(f - 32) * 5 / 9", "f - 32 * 5 / 9", "{f} gives wrong results. Fix it."),
    _m("temperature", "convert", "describe", "flip_operator", "c <= 0", "c < 0", "{f} calls 0 degrees cold instead of freezing."),
    _m("temperature", "convert", "describe", "remove_condition", '    if c < 25:\n        return "mild"\n', "", '{f} never says "mild".'),
    _m("dates", "calendar", "is_leap", "flip_operator", "year % 400 == 0", "year % 400 != 0", "{f} is wrong for century years."),
    _m("dates", "calendar", "day_of_year", "wrong_value", "range(1, month)", "range(1, month + 1)", "{f} is off by a month."),
    _m("dates", "calendar", "days_in_month", "wrong_value", "_DAYS[month - 1]", "_DAYS[month % 12]", "{f} returns the next month's length."),
    _m("search", "bisection", "lower_bound", "flip_operator", "xs[mid] < x", "xs[mid] <= x", "{f} skips past equal elements."),
    _m("search", "bisection", "index_of", "remove_condition", "i < len(xs) and xs[i] == x", "xs[i] == x",
       "{f} crashes when the value is larger than every element."),
    _m("search", "bisection", "count_in_range", "wrong_value", "lower_bound(xs, hi + 1)", "lower_bound(xs, hi)", "{f} misses elements equal to hi."),
    _m("vectors", "vec", "Vec2.dot", "flip_operator", "+ self.y * other.y", "- self.y * other.y", "{f} gives wrong results."),
    _m("vectors", "vec", "Vec2.normalized", "remove_condition", '        if n == 0:\n            raise ValueError("cannot normalize the zero vector")\n', "",
       "{f} should raise ValueError for the zero vector."),
    _m("inventory", "store", "Inventory.remove", "remove_condition", "        if self.stock[item] == 0:\n            del self.stock[item]\n", "",
       "{f} keeps items whose quantity reaches zero."),
    _m("inventory", "report", "low_stock", "flip_operator", "qty < threshold", "qty <= threshold", "{f} includes items exactly at the threshold."),
    _m("inventory", "report", "total_value", "wrong_value", "prices.get(item, 0)", "prices[item]", "{f} crashes on items without a price."),
    _m("grades", "scores", "letter", "flip_operator", "score >= cutoff", "score > cutoff", "{f} gives the lower grade on a cutoff."),
    _m("grades", "scores", "median", "wrong_value", "xs = sorted(scores)", "xs = list(scores)", "{f} is wrong for unsorted input."),
    _m("matrix", "ops", "matmul", "wrong_value", "for col in bt]", "for col in b]", "{f} gives wrong products."),
    _m("matrix", "ops", "matmul", "remove_condition", '    if len(a[0]) != len(b):\n        raise ValueError("inner dimensions differ")\n', "",
       "{f} should reject mismatched dimensions with ValueError."),
]


# ---------------------------------------------------------------- projects and mutations


def projects() -> list[str]:
    return sorted(p.name for p in PROJECTS_DIR.iterdir() if (p / "tests").is_dir())


def project_files(name: str) -> dict[str, str]:
    """relpath -> text of the project as committed, plus its generated pyproject.toml."""
    root = PROJECTS_DIR / name
    files = {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))
             if "__pycache__" not in p.parts}
    files["pyproject.toml"] = PYPROJECT.format(name=name)
    return files


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """qualname -> def, for module-level functions and methods of module-level classes."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
    return out


def _find(src: str, qualname: str) -> ast.FunctionDef:
    funcs = _functions(ast.parse(src))
    if qualname not in funcs:
        raise TaskError(f"smoke library: no function {qualname} (have {sorted(funcs)})")
    return funcs[qualname]


def body_removals(name: str) -> list[Mutation]:
    """A remove_body mutation for every public, documented function of a project."""
    out = []
    for path, src in project_files(name).items():
        if not path.startswith(f"{name}/"):
            continue
        for qual, node in _functions(ast.parse(src)).items():
            if not node.name.startswith("_") and ast.get_docstring(node):
                out.append(Mutation(name, path, qual, "remove_body",
                                    says=f"Implement {{f}}."))
    return out


def mutate(src: str, m: Mutation) -> str:
    """The module source with mutation `m` applied."""
    node = _find(src, m.qualname)
    lines = src.splitlines(keepends=True)
    if m.kind == "remove_body":
        body = node.body[1:] if ast.get_docstring(node) else node.body
        first = body[0].lineno
        indent = re.match(r"\s*", lines[first - 1]).group()
        return "".join(lines[:first - 1] + [f"{indent}raise NotImplementedError\n"] + lines[node.end_lineno:])
    start = node.lineno - 1 - len(node.decorator_list)
    segment = "".join(lines[start:node.end_lineno])
    if segment.count(m.old) != 1:
        raise TaskError(f"smoke library: {m.old!r} occurs {segment.count(m.old)} times in {m.qualname}, expected once")
    return "".join(lines[:start]) + segment.replace(m.old, m.new) + "".join(lines[node.end_lineno:])


def test_ids(files: dict[str, str]) -> list[str]:
    return [f"{path}::{node.name}" for path, src in sorted(files.items()) if path.startswith("tests/")
            for node in ast.parse(src).body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def drop_tests(src: str, names: set[str]) -> str:
    """The test module without the named top-level test functions; "" if no test is left."""
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    keep = [True] * len(lines)
    left = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            keep[start:node.end_lineno] = [False] * (node.end_lineno - start)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            left += 1
    if not left:
        return ""
    text = "".join(line for line, k in zip(lines, keep) if k)
    return re.sub(r"\n{3,}", "\n\n\n", text).rstrip("\n") + "\n"


# ---------------------------------------------------------------- candidates and tasks


def catalog() -> tuple[list[tuple[Mutation, ...]], list[tuple[Mutation, ...]]]:
    """(singles, pairs): every candidate task, in a fixed order. A pair breaks two different
    functions of one project, with any two of their mutations."""
    singles, pairs = [], []
    for name in projects():
        mine = body_removals(name) + [m for m in MUTATIONS if m.project == name]
        singles += [(m,) for m in mine]
        pairs += [(a, b) for i, a in enumerate(mine) for b in mine[i + 1:] if a.qualname != b.qualname]
    return singles, pairs


def task_id(muts: tuple[Mutation, ...]) -> str:
    parts = [f"{m.qualname.replace('.', '_').lower()}-{m.kind.replace('_', '-')}" for m in muts]
    return "-".join([muts[0].project, *parts])


def instruction(muts: tuple[Mutation, ...]) -> str:
    return " ".join(m.says.format(f=f"`{m.qualname}` in {m.path}") for m in muts)


def _round_robin(cands: list[tuple[Mutation, ...]]) -> list[tuple[Mutation, ...]]:
    by_project: dict[str, list] = {}
    for c in cands:
        by_project.setdefault(c[0].project, []).append(c)
    queues = list(by_project.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def generate_tasks(n: int, seed: int, out_dir: Path | str, *, backend: Backend | None = None,
                   suite_name: str = "smoke") -> list[Path]:
    """Write n validated-by-construction task directories and a suite.toml under out_dir."""
    from opencomposer.tasks.build import default_backend

    backend = backend or default_backend()
    out_dir = Path(out_dir)
    rng = random.Random(seed)
    singles, pairs = catalog()
    rng.shuffle(singles)
    rng.shuffle(pairs)
    made: list[Path] = []
    for muts in _round_robin(singles) + _round_robin(pairs):
        if len(made) == n:
            break
        path = make_task(muts, out_dir, backend)
        if path is not None:
            made.append(path)
    if len(made) < n:
        raise TaskError(f"only {len(made)} smoke tasks could be made, {n} asked for")
    Suite(out_dir, SuiteSpec(name=suite_name, version=GENERATOR_VERSION,
                             description=f"{n} generated smoke tasks (opencomposer.tasks.smoke, seed {seed}): "
                                         "tiny projects with one behaviour removed or broken.",
                             tasks=sorted(p.name for p in made)), []).save()
    return made


_sound: set[str] = set()
"""Projects whose tests were seen passing on their original code (checked once per process)."""


def make_task(muts: tuple[Mutation, ...], out_dir: Path, backend: Backend) -> Path | None:
    """Write one task for the mutations; None if no test notices them."""
    from opencomposer.tasks.grade import grade

    name = muts[0].project
    gold = project_files(name)
    broken = dict(gold)
    for m in muts:
        broken[m.path] = mutate(broken[m.path], m)
    ids = test_ids(gold)
    with tempfile.TemporaryDirectory() as tmp:  # a provisional task: every test visible and named
        probe = _write(Path(tmp) / "probe", "probe", muts, broken, {}, ids, [], tree_diff(broken, gold))
        outcomes = grade(probe, "", backend=backend).tests
        if name not in _sound:
            check = grade(probe, probe.gold_patch, backend=backend)
            if not check.resolved:
                raise TaskError(f"smoke library: {name}'s tests fail on its own code: {check.tests}\n{check.log}")
            _sound.add(name)
    f2p = [t for t in ids if outcomes[t] != "passed"]
    if not f2p:
        return None
    hidden_names = {t.split("::")[1] for t in f2p}
    hidden = {p: gold[p] for p in {t.split("::")[0] for t in f2p}}
    visible = dict(broken)
    for p in hidden:
        trimmed = drop_tests(gold[p], hidden_names)
        if trimmed:
            visible[p] = trimmed
        else:
            del visible[p]
    source_files = {p: t for p, t in gold.items() if not p.startswith("tests/")}
    gold_patch = tree_diff({p: broken[p] for p in source_files}, source_files)
    p2p = [t for t in ids if t not in f2p]
    task = _write(out_dir / task_id(muts), task_id(muts), muts, visible, hidden, f2p, p2p, gold_patch)
    return task.path


def _write(path: Path, tid: str, muts: tuple[Mutation, ...], workspace: dict[str, str], hidden: dict[str, str],
           f2p: list[str], p2p: list[str], gold_patch: str) -> Task:
    if path.exists():
        shutil.rmtree(path)
    for sub, files in ((WORKSPACE_DIR, workspace), (HIDDEN_DIR, hidden)):
        (path / sub).mkdir(parents=True)
        for rel, text in files.items():
            (path / sub / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / sub / rel).write_text(text)
    (path / GOLD_PATCH).write_text(gold_patch)
    text = instruction(muts)
    lines, nfiles = patch_stats(gold_patch)
    spec = TaskSpec(
        id=tid, instruction=text, created=CREATED,
        source=Source(kind="generated", package=muts[0].project, version=GENERATOR_VERSION, sha256="generated"),
        tests=TaskTests(fail_to_pass=f2p, pass_to_pass=p2p, timeout_s=60),
        environment=Environment(requirements=REQUIREMENTS, test=".venv/bin/python -m pytest -q"),
        stats=Stats(gold_lines_changed=lines, gold_files_changed=nfiles, instruction_chars=len(text)))
    task = Task(path, spec)
    task.save()
    return task


def main() -> None:
    ap = argparse.ArgumentParser(description="Generate smoke tasks (see the module docstring).")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("tasks/suites/smoke"))
    ap.add_argument("--name", default="smoke")
    args = ap.parse_args()
    for path in generate_tasks(args.n, args.seed, args.out, suite_name=args.name):
        print(path)


if __name__ == "__main__":
    main()
