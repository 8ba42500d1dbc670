"""The demo's task family: one-module mini projects with one templated bug, and their oracle.

`make demo` must show a tiny model, trained on a 2-core CPU in minutes, get better at tasks it
never trained on. Real bugs are out of reach at that scale, so the demo trains and evaluates on
this generated family, through the same sandbox, tools, agent loop, grader and hidden tests
as every other suite. A task:

    <pkg>/<module>.py       1 + difficulty one-line functions, one of them broken
    tests/test_<module>.py  visible tests of the other functions (pass-to-pass)
    hidden_tests/...        the full test file: the broken function's test is fail-to-pass
    instruction             terse, names the function and the file, says what is wrong:
                            "`add_fee` in shop/core.py subtracts instead of adding."

Bugs come from templates (TEMPLATES): a flipped operator (`-` for `+`, `>` for `>=`), a wrong
constant, swapped arguments, `min` for `max`. Names (package, module, function, arguments)
and constants are drawn per task, so held-out tasks are new instances of the same kinds of
bug, not copies: `generate_tasks(..., exclude=train_ids)` also refuses any instance whose
broken module text a training task already has (the id carries its hash).

The knob is `difficulty` = distractor functions in the module (0..4): the agent must find
the named function among them and copy the exact line. `two_file_rate` mixes in two-file tasks
(`make_two_file_instance`: two modules of one package, a named bug in each), the hard half of
issue 21's easy/hard mix, where reading both files in one turn (parallel calls) saves a turn. A solution is two tool calls,
`read_file` then `edit_file` with the broken line as old_string, which is what
`ReadEditOracle` does (and, with a share of decoys, `demonstrator`: every bug form has a
plausible wrong fix, `Bug.decoy`, written to decoy.patch, that an imperfect demonstrator writes
instead); `DEMO_AGENT` is the demo's environment: a short system prompt and
only those two tools (the full tool set's schemas are ~2,100 tokens, which a CPU would spend
most of its time attending to).

Tasks are validated by construction and in process (the gold function passes every test
case, the broken one fails at least one; both are evaluated in this process, on code this
module wrote); tests/tasks/test_demo_family.py also grades a sample through the real grader
in the sandbox (gold resolves, no change fails). Left out: bugs that span files (a two-file
task is two independent one-line bugs) and bugs that need running the tests to find (the smoke
family and mined suites have those).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opencomposer.errors import TaskError
from opencomposer.harness.agent import AgentConfig, ChatReply
from opencomposer.tasks.policies import parse_patch
from opencomposer.tasks.smoke import CREATED, PYPROJECT, REQUIREMENTS
from opencomposer.tasks.task import (GOLD_PATCH, HIDDEN_DIR, WORKSPACE_DIR, Environment, Source, Stats, Suite,
                                     SuiteSpec, Task, TaskSpec, TaskTests, patch_stats, tree_diff)

GENERATOR_VERSION = "1"
DECOY_PATCH = "decoy.patch"
"""Next to gold.patch: the bug's plausible wrong fix (Bug.decoy), for the imperfect demonstrator."""
MAX_DIFFICULTY = 4

DEMO_SYSTEM_PROMPT = ("You fix bugs in the project in /workspace. Read the file, then fix the bug "
                      "with edit_file. Reply without tool calls when done.")
DEMO_AGENT = AgentConfig(system_prompt=DEMO_SYSTEM_PROMPT, tools=["read_file", "edit_file"], compact_tools=True,
                         max_turns=4, max_total_tokens=512, max_new_tokens=160, summarize_at=None, context_window=1024,
                         max_tool_errors=1)
"""The demo's environment: tool subset with compact schemas (a system turn of ~190 tokens instead
of ~590), short prompt, 4 turns (read, edit, answer, one spare), and the episode ends at the first
failed tool call (no success of the SFT checkpoint ever followed one; docs/demo-design.md)."""

PACKAGES = ["shop", "bank", "garden", "fleet", "clinic", "arcade", "market", "school", "harbor", "studio",
            "orchard", "depot", "bakery", "museum", "ranch", "lab", "farm", "hotel", "gym", "atlas"]
MODULES = ["core", "rules", "calc", "pricing", "scores", "limits", "units", "stock", "rates", "utils"]
VERBS = ["total", "adjust", "check", "scale", "compute", "apply", "count", "measure", "rate", "bound",
         "score", "weigh", "sum", "shift", "cap", "mark"]
NOUNS = ["price", "fee", "score", "level", "weight", "bonus", "stock", "speed", "margin", "points", "budget",
         "load", "rent", "tax", "size", "age"]
PAIRS = [("a", "b"), ("x", "y"), ("left", "right"), ("base", "extra"), ("n", "m"), ("first", "second"),
         ("old", "new"), ("p", "q")]
SINGLES = ["x", "n", "value", "amount", "size", "total", "qty", "v"]


@dataclass(frozen=True)
class Bug:
    """One way to break a template: the broken expression and the instruction's wording."""

    kind: str
    """flip_operator | wrong_constant | swapped_arguments | wrong_call."""
    expr: str
    """The broken expression, with the template's placeholders ({a}, {b}, {x}, {c}, {w})."""
    says: str
    """The instruction; {f} is the function, {path} its file, {c} the right constant."""
    decoy: str
    """A plausible wrong fix of the broken line (another edit than the one the instruction asks
    for; it fails the hidden test): what an imperfect demonstrator writes (`demonstrator`)."""


@dataclass(frozen=True)
class Template:
    """A one-line function `def f(params): return expr` and the ways to break it."""

    name: str
    arity: int
    expr: str
    bugs: tuple[Bug, ...]
    cases: Callable[[random.Random, int], list[tuple]]
    """Test inputs for constant c (they must tell every bug from the correct expression)."""


def _pairs(rng: random.Random, c: int) -> list[tuple]:
    return [(rng.randint(2, 9), rng.randint(11, 20)), (rng.randint(21, 30), rng.randint(3, 9))]


def _around(rng: random.Random, c: int) -> list[tuple]:
    return [(c,), (c - 1,), (c + 1,), (c + rng.choice([-1, 1]) * rng.randint(2, 5),)]


def _one(rng: random.Random, c: int) -> list[tuple]:
    return [(rng.randint(2, 9),), (rng.randint(10, 30),)]


def _ratios(rng: random.Random, c: int) -> list[tuple]:
    b = rng.randint(2, 5)
    return [(b * rng.randint(3, 9), b), (rng.randint(2, 3), 8)]


TEMPLATES = [
    Template("add", 2, "{a} + {b}", (
        Bug("flip_operator", "{a} - {b}", "`{f}` in {path} subtracts instead of adding.", "{b} - {a}"),), _pairs),
    Template("sub", 2, "{a} - {b}", (
        Bug("swapped_arguments", "{b} - {a}", "`{f}` in {path} has its arguments swapped.", "{b} + {a}"),
        Bug("flip_operator", "{a} + {b}", "`{f}` in {path} adds instead of subtracting.", "{b} - {a}")), _pairs),
    Template("ratio", 2, "{a} / {b}", (
        Bug("swapped_arguments", "{b} / {a}", "`{f}` in {path} has its arguments swapped.", "{b} * {a}"),), _ratios),
    Template("scale", 1, "{x} * {c}", (
        Bug("wrong_constant", "{x} * {w}", "`{f}` in {path} should multiply by {c}.", "{x} + {c}"),), _one),
    Template("offset", 1, "{x} + {c}", (
        Bug("wrong_constant", "{x} + {w}", "`{f}` in {path} should add {c}.", "{x} * {c}"),
        Bug("flip_operator", "{x} - {c}", "`{f}` in {path} subtracts {c} instead of adding it.", "{c} - {x}")), _one),
    Template("at_least", 1, "{x} >= {c}", (
        Bug("flip_operator", "{x} > {c}", "`{f}` in {path} should be true at exactly {c}.", "{x} <= {c}"),
        Bug("wrong_constant", "{x} >= {w}", "`{f}` in {path} should compare with {c}.", "{x} > {c}")), _around),
    Template("below", 1, "{x} < {c}", (
        Bug("flip_operator", "{x} <= {c}", "`{f}` in {path} should be false at exactly {c}.", "{x} > {c}"),), _around),
    Template("larger", 2, "max({a}, {b})", (
        Bug("wrong_call", "min({a}, {b})", "`{f}` in {path} should return the larger value.", "min({b}, {a})"),), _pairs),
    Template("smaller", 2, "min({a}, {b})", (
        Bug("wrong_call", "max({a}, {b})", "`{f}` in {path} should return the smaller value.", "max({b}, {a})"),), _pairs),
]



@dataclass
class _Func:
    name: str
    params: str
    fill: dict
    template: Template

    def line(self, expr: str) -> str:
        return f"def {self.name}({self.params}):\n    return {expr.format(**self.fill)}\n"

    def call(self, expr: str) -> Callable:
        return eval(f"lambda {self.params}: {expr.format(**self.fill)}")  # our own generated one-liner


@dataclass
class Part:
    """One module of a task: its file, its test file and the test its bug breaks."""

    module_path: str
    test_path: str
    tests: dict[str, str]
    """Test function name -> its source (one per function, in module order)."""
    broken_test: str
    kind: str


@dataclass
class Instance:
    """One generated task before it is written: files, tests, instruction."""

    id: str
    package: str
    gold: dict[str, str]
    broken: dict[str, str]
    parts: list[Part]
    """One per broken module: one for the one-file tasks, two for the two-file ones."""
    instruction: str
    kind: str
    """The bug's kind, or "two_file" (then each part has its own)."""
    decoy: dict[str, str]
    """Each broken module with its broken line replaced by the bug's decoy fix."""

    @property
    def module_path(self) -> str:
        return self.parts[0].module_path

    @property
    def test_path(self) -> str:
        return self.parts[0].test_path

    @property
    def tests(self) -> dict[str, str]:
        return self.parts[0].tests

    @property
    def broken_test(self) -> str:
        return self.parts[0].broken_test


def _draw_function(rng: random.Random, template: Template, used: set[str]) -> _Func:
    while True:
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
        if name not in used:
            used.add(name)
            break
    if template.arity == 2:
        a, b = rng.choice(PAIRS)
        fill, params = {"a": a, "b": b}, f"{a}, {b}"
    else:
        x = rng.choice(SINGLES)
        fill, params = {"x": x}, x
    c = rng.randint(2, 12)
    fill |= {"c": c, "w": c + rng.choice([-1, 1, 2])}
    return _Func(name, params, fill, template)


def _test_source(f: _Func, cases: list[tuple]) -> str:
    gold = f.call(f.template.expr)
    lines = [f"def test_{f.name}():"]
    lines += [f"    assert {f.name}({', '.join(map(repr, args))}) == {gold(*args)!r}" for args in cases]
    return "\n".join(lines) + "\n"


@dataclass
class _Module:
    part: Part
    gold: dict[str, str]
    broken: str
    decoy: str
    says: str
    target: str


def _draw_module(rng: random.Random, pkg: str, mod: str, difficulty: int, used: set[str]) -> _Module:
    """1 + difficulty functions in <pkg>/<mod>.py, the first drawn one broken, and their tests."""
    funcs = [_draw_function(rng, t, used) for t in rng.sample(TEMPLATES, 1 + difficulty)]
    target, bug = funcs[0], rng.choice(funcs[0].template.bugs)
    rng.shuffle(funcs)  # the broken function anywhere in the module
    cases = {f.name: f.template.cases(rng, f.fill["c"]) for f in funcs}
    good, bad, decoy = target.call(target.template.expr), target.call(bug.expr), target.call(bug.decoy)
    for what, f in (("bug " + bug.kind, bad), ("the decoy fix " + bug.decoy, decoy)):
        if all(good(*a) == f(*a) for a in cases[target.name]):
            raise TaskError(f"demo family: the test cases of {target.name} cannot see {what}")
    module_path, test_path = f"{pkg}/{mod}.py", f"tests/test_{mod}.py"

    def module(target_expr: str) -> str:
        return "\n\n".join(f.line(target_expr if f is target else f.template.expr) for f in funcs)

    tests = {f"test_{f.name}": _test_source(f, cases[f.name]) for f in funcs}
    header = f"from {pkg}.{mod} import {', '.join(f.name for f in funcs)}\n\n\n"
    gold = {module_path: module(target.template.expr), test_path: header + "\n\n".join(tests.values())}
    return _Module(Part(module_path, test_path, tests, f"test_{target.name}", bug.kind), gold, module(bug.expr),
                   module(bug.decoy), bug.says.format(f=target.name, path=module_path, c=target.fill["c"]),
                   target.name)


def _instance(pkg: str, modules: list[_Module], kind: str, name: str) -> Instance:
    gold = {"pyproject.toml": PYPROJECT.format(name=pkg), f"{pkg}/__init__.py": ""}
    for m in modules:
        gold |= m.gold
    broken = dict(gold, **{m.part.module_path: m.broken for m in modules})
    digest = hashlib.sha256("".join(m.broken for m in modules).encode()).hexdigest()[:8]
    return Instance(f"{pkg}-{name}-{kind.replace('_', '-')}-{digest}", pkg, gold, broken, [m.part for m in modules],
                    " ".join(m.says for m in modules), kind, {m.part.module_path: m.decoy for m in modules})


def make_instance(rng: random.Random, difficulty: int) -> Instance:
    """Draw one task: 1 + difficulty functions in one module, the first drawn one broken."""
    if not 0 <= difficulty <= MAX_DIFFICULTY:
        raise TaskError(f"difficulty must be 0..{MAX_DIFFICULTY}, got {difficulty}")
    pkg, mod = rng.choice(PACKAGES), rng.choice(MODULES)
    m = _draw_module(rng, pkg, mod, difficulty, set())
    return _instance(pkg, [m], m.part.kind, m.target.replace("_", "-"))


def make_two_file_instance(rng: random.Random, difficulty: int) -> Instance:
    """Draw a two-file task: two modules of one package, each with one broken function, both
    named in the instruction. Both files must be read before both fixes: reading them in one
    turn (two read_file calls in one reply) saves a turn, which is what the length penalty's
    turn term pays for (issue 21)."""
    if not 0 <= difficulty <= MAX_DIFFICULTY:
        raise TaskError(f"difficulty must be 0..{MAX_DIFFICULTY}, got {difficulty}")
    pkg = rng.choice(PACKAGES)
    used: set[str] = set()
    modules = [_draw_module(rng, pkg, mod, difficulty, used) for mod in rng.sample(MODULES, 2)]
    return _instance(pkg, modules, "two_file", "-".join(m.target.replace("_", "-") for m in modules))


def write_task(inst: Instance, out_dir: Path) -> Path:
    """The task directory: workspace/ without the broken functions' tests, hidden_tests/ with all."""
    path = out_dir / inst.id
    if path.exists():
        shutil.rmtree(path)
    visible = dict(inst.broken)
    for part in inst.parts:
        others = [src for name, src in part.tests.items() if name != part.broken_test]
        if others:
            names = [n.removeprefix("test_") for n in part.tests if n != part.broken_test]
            visible[part.test_path] = (f"from {inst.package}.{Path(part.module_path).stem} import {', '.join(names)}"
                                       "\n\n\n" + "\n\n".join(others))
        else:
            del visible[part.test_path]
    hidden = {part.test_path: inst.gold[part.test_path] for part in inst.parts}
    for sub, files in ((WORKSPACE_DIR, visible), (HIDDEN_DIR, hidden)):
        for rel, text in files.items():
            (path / sub / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / sub / rel).write_text(text)
    broken = {part.module_path: inst.broken[part.module_path] for part in inst.parts}
    gold_patch = tree_diff(broken, {m: inst.gold[m] for m in broken})
    (path / GOLD_PATCH).write_text(gold_patch)
    (path / DECOY_PATCH).write_text(tree_diff(broken, inst.decoy))
    lines, nfiles = patch_stats(gold_patch)
    f2p = [f"{part.test_path}::{part.broken_test}" for part in inst.parts]
    p2p = [f"{part.test_path}::{n}" for part in inst.parts for n in part.tests if n != part.broken_test]
    spec = TaskSpec(
        id=inst.id, instruction=inst.instruction, created=CREATED,
        source=Source(kind="generated", package=inst.package, version=GENERATOR_VERSION, sha256="generated"),
        tests=TaskTests(fail_to_pass=f2p, pass_to_pass=p2p, timeout_s=60),
        environment=Environment(requirements=REQUIREMENTS, test=".venv/bin/python -m pytest -q"),
        stats=Stats(gold_lines_changed=lines, gold_files_changed=nfiles, instruction_chars=len(inst.instruction)))
    return Task(path, spec).save()


def instance_hash(task_id: str) -> str:
    """The broken module's hash that ends a demo task id (what `exclude` compares)."""
    return task_id.rsplit("-", 1)[-1]


def generate_tasks(n: int, seed: int, out_dir: Path | str, *, difficulty: int = 1, exclude: set[str] = frozenset(),
                   suite_name: str = "demo", two_file_rate: float = 0.0) -> list[Path]:
    """Write n task directories and a suite.toml under out_dir (deterministic for a seed).

    `exclude`: task ids (e.g. the training suite's) whose instances must not reappear.
    `two_file_rate`: the share of two-file tasks (make_two_file_instance), drawn per task; at 0
    the generator draws exactly what it drew before they existed.
    """
    if not 0.0 <= two_file_rate <= 1.0:
        raise TaskError(f"two_file_rate must be in [0, 1], got {two_file_rate}")
    out_dir = Path(out_dir)
    rng = random.Random(f"demo-family/{seed}/{difficulty}")
    seen = {instance_hash(t) for t in exclude}
    made: list[Path] = []
    attempts = 0
    while len(made) < n:
        attempts += 1
        if attempts > 20 * n + 100:
            raise TaskError(f"demo family: only {len(made)} distinct tasks after {attempts} draws (n={n})")
        two_files = bool(two_file_rate) and rng.random() < two_file_rate
        inst = make_two_file_instance(rng, difficulty) if two_files else make_instance(rng, difficulty)
        if instance_hash(inst.id) in seen:
            continue
        seen.add(instance_hash(inst.id))
        made.append(write_task(inst, out_dir))
    mix = f", {two_file_rate:.0%} of them two-file tasks" if two_file_rate else ""
    Suite(out_dir, SuiteSpec(
        name=suite_name, version=GENERATOR_VERSION,
        description=(f"{n} generated demo tasks (opencomposer.tasks.demo_family, seed {seed}, difficulty "
                     f"{difficulty}{mix}): one-module projects with one templated bug in a one-line function."),
        tasks=sorted(p.name for p in made),
        miner={"generator": "demo_family", "seed": seed, "difficulty": difficulty, "n": n,
               **({"two_file_rate": two_file_rate} if two_file_rate else {})}), []).save()
    return made


def two_file(task: Task) -> bool:
    """Whether a demo task is a two-file one (its gold patch changes two files)."""
    return task.spec.stats.gold_files_changed > 1


# ----------------------------------------------------------------------------- the oracle


def _strip_common(old: str, new: str) -> tuple[str, str]:
    """Drop the shared leading indentation and the shared final newline of an edit."""
    indent = re.match(r"[ \t]*", old).group()
    if indent and new.startswith(indent):
        old, new = old[len(indent):], new[len(indent):]
    if old.endswith("\n") and new.endswith("\n"):
        old, new = old[:-1], new[:-1]
    return old, new


def minimal_edits(path: str, text: str, hunks) -> list[tuple[str, str]]:
    """(old_string, new_string) per hunk: only the changed lines, without their indentation and
    final newline, widened by whole lines only when that text is not unique in the file."""
    edits, delta = [], 0  # delta: lines added minus removed by earlier hunks
    for h in hunks:
        lines = text.splitlines(keepends=True)
        i = 0
        while i < min(len(h.old), len(h.new)) and h.old[i] == h.new[i]:
            i += 1
        j = 0
        while j < min(len(h.old), len(h.new)) - i and h.old[-1 - j] == h.new[-1 - j]:
            j += 1
        start = h.index + delta
        a, b = start + i, start + len(h.old) - j  # the changed lines of the current text
        core = h.new[i:len(h.new) - j]
        old, new = _strip_common("".join(lines[a:b]), "".join(core))
        lo, hi = a, b
        while not old or text.count(old) != 1:
            if lo == 0 and hi == len(lines):
                raise TaskError(f"{path}: no unique old_string for the hunk @@ -{h.old_start}")
            lo, hi = max(lo - 1, 0), min(hi + 1, len(lines))
            old, new = "".join(lines[lo:hi]), "".join(lines[lo:a] + core + lines[b:hi])
        edits.append((old, new))
        text = text.replace(old, new, 1)
        delta += len(h.new) - len(h.old)
    return edits


def _call(k: int, name: str, **arguments) -> dict:
    return {"id": f"oracle_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class ReadEditOracle:
    """The demo's SFT teacher (any generated task): read every file the gold patch modifies,
    then one minimal `edit_file` per hunk, then a short answer. Scores 100% like
    OraclePolicy, with the trajectory a person would write: look, then change one line.
    `decoy`: write the task's decoy patch (DECOY_PATCH: a plausible wrong fix) instead.
    `parallel`: the reads in one turn and the edits in one turn (several calls in one reply);
    False: one call a turn (two-file tasks take two more turns; one-file tasks are the same).
    `verify`: read the last edited file again before answering, one more turn that a
    successful edit_file already made needless (the habit the length penalty can remove).
    `survey`: first read the package's __init__.py (empty) in a turn of its own, a look around
    the package that the fix never needs: a needless turn before the reads, on any task.
    `teach_choice` False: when the first turn batches reads, list it in `untaught_turns`, the
    assistant turns SFT leaves out of its loss (pretrain/sft.render): the demonstration then
    teaches working from two files read in one turn, not the choice to read them so."""

    name = "oracle:read-edit"

    def __init__(self, task: Task, final: str = "Done.", decoy: bool = False, parallel: bool = True,
                 verify: bool = False, teach_choice: bool = True, survey: bool = False):
        if task.spec.source.kind != "generated":
            raise TaskError(f"{task.id}: ReadEditOracle needs a generated task (a workspace/ to read)")
        if decoy and not (task.path / DECOY_PATCH).is_file():
            raise TaskError(f"{task.id}: no {DECOY_PATCH} (a demo-family task written before decoys; regenerate it)")
        self.decoy, self.parallel, self.verify, self.survey = decoy, parallel, verify, survey
        files = parse_patch((task.path / DECOY_PATCH).read_text() if decoy else task.gold_patch)
        if any(fp.kind != "modify" for fp in files):
            raise TaskError(f"{task.id}: ReadEditOracle handles gold patches that only modify files")
        reads, edits = [], []
        for fp in files:
            reads.append(_call(len(reads), "read_file", path=fp.path))
            text = (task.workspace_dir / fp.path).read_text()
            edits += [(fp.path, old, new) for old, new in minimal_edits(fp.path, text, fp.hunks)]
        edits = [_call(len(reads) + k, "edit_file", path=p, old_string=o, new_string=n)
                 for k, (p, o, n) in enumerate(edits)]
        turns = [reads, edits] if parallel else [[c] for c in reads + edits]
        self.untaught_turns = [] if teach_choice or len(turns[0]) < 2 else [int(survey)]
        if verify:
            turns.append([_call(len(reads) + len(edits), "read_file", path=files[-1].path)])
        if survey:
            turns.insert(0, [_call(len(reads) + len(edits) + verify, "read_file",
                                   path=f"{task.spec.source.package}/__init__.py")])
        self.plan = [{"role": "assistant", "content": "", "tool_calls": calls} for calls in turns]
        self.plan.append({"role": "assistant", "content": final})

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply:
        done = sum(m["role"] == "assistant" for m in messages)
        return ChatReply(self.plan[min(done, len(self.plan) - 1)])


def _hashed_share(what: str, task_id: str, rate: float, seed: int) -> bool:
    u = int(hashlib.sha256(f"{what}/{seed}/{task_id}".encode()).hexdigest()[:12], 16) / 16 ** 12
    return u < rate


def writes_decoy(task_id: str, decoy_rate: float, seed: int = 0) -> bool:
    """Whether the imperfect demonstrator writes the decoy fix on this task: a hash of the seed
    and the id against the rate, so the choice is the same on every rerun and independent of
    the task's kind."""
    return _hashed_share("demonstrator", task_id, decoy_rate, seed)


def habits(task_id: str, parallel_rate: float = 1.0, verify_rate: float = 0.0, seed: int = 0) -> tuple[bool, bool]:
    """(parallel, verify) of the demonstrator on this task: hashes of the seed and the id, each
    with its own salt, so they are independent of each other and of the decoy choice."""
    return (_hashed_share("parallel", task_id, parallel_rate, seed),
            _hashed_share("verify", task_id, verify_rate, seed))


def surveys(task_id: str, survey_rate: float = 0.0, seed: int = 0) -> bool:
    """Whether the demonstrator first reads the package's __init__.py on this task (ReadEditOracle's
    `survey`): a hash of the seed and the id with its own salt, like the habits."""
    return _hashed_share("survey", task_id, survey_rate, seed)


HABIT_TASKS = ("all", "one_file")
"""Which tasks the demonstrator's needless habits (the survey, the re-read) may fall on: any, or
only one-file tasks (then a two-file task's only needless turns are its unbatched calls)."""


def _check_habit_tasks(habit_tasks: str) -> None:
    if habit_tasks not in HABIT_TASKS:
        raise TaskError(f"habit_tasks must be one of {', '.join(HABIT_TASKS)}, got {habit_tasks!r}")


def teacher_habits(task: Task, parallel_rate: float = 1.0, verify_rate: float = 0.0, survey_rate: float = 0.0,
                   seed: int = 0, habit_tasks: str = "all") -> tuple[bool, bool, bool]:
    """(parallel, verify, survey) of the demonstrator on this task: `habits` and `surveys`, with the
    re-read and the survey off on two-file tasks when `habit_tasks` is "one_file"."""
    _check_habit_tasks(habit_tasks)
    parallel, verify = habits(task.id, parallel_rate, verify_rate, seed)
    survey = surveys(task.id, survey_rate, seed)
    if habit_tasks == "one_file" and two_file(task):
        verify = survey = False
    return parallel, verify, survey


def teaches_choice(task_id: str, parallel_choice_rate: float = 1.0, seed: int = 0) -> bool:
    """Whether a batching demonstration keeps its first turn (the choice to batch the reads) in
    SFT's loss: a hash of the seed and the id with its own salt, like the habits."""
    return _hashed_share("parallel-choice", task_id, parallel_choice_rate, seed)


def demonstrator(decoy_rate: float = 0.0, seed: int = 0, parallel_rate: float = 1.0,
                 verify_rate: float = 0.0, parallel_choice_rate: float = 1.0,
                 survey_rate: float = 0.0, habit_tasks: str = "all") -> Callable[[Task], ReadEditOracle]:
    """The SFT teacher as a policy factory: ReadEditOracle, writing the decoy fix instead of the
    gold one on a `decoy_rate` share of the tasks (its trajectories look the same: read, one edit
    of the named line, "Done."). A demonstrator that is right on only part of its demonstrations
    is what SFT data from people or other models is; RL's grader is what can tell the two fixes
    apart (docs/demo-design.md, session 7).

    Its habits (issue 21): on a `parallel_rate` share of the tasks it batches its calls (reads in
    one turn, edits in one turn), on the rest one call a turn; on a `verify_rate` share it reads
    the edited file again before answering; on a `survey_rate` share it first reads the package's
    __init__.py in a turn of its own. All cost turns and change nothing the grader sees: what only
    the length penalty can teach away. The defaults (1.0, 0.0, 0.0) are the teacher as it was
    before them. `habit_tasks` "one_file" keeps the re-read and the survey off two-file tasks
    (teacher_habits): there the only turns to save are the unbatched calls.

    `parallel_choice_rate`: the share of the batching demonstrations whose first turn SFT learns
    from; on the rest it learns what follows reads batched in one turn but not the choice to
    batch them (`teaches_choice`). With parallel_rate p and this rate c, the two-file
    demonstrations teach the choice on p*c / (p*c + 1 - p) of the tasks that SFT learns a first
    turn from, and working from batched reads on p of them: a policy that rarely batches its
    reads but completes the batched path (issue 21's baseline)."""
    for name, rate in (("decoy_rate", decoy_rate), ("parallel_rate", parallel_rate), ("verify_rate", verify_rate),
                       ("parallel_choice_rate", parallel_choice_rate), ("survey_rate", survey_rate)):
        if not 0.0 <= rate <= 1.0:
            raise TaskError(f"{name} must be in [0, 1], got {rate}")
    _check_habit_tasks(habit_tasks)  # before any task, not at the first one

    def make(task: Task) -> ReadEditOracle:
        parallel, verify, survey = teacher_habits(task, parallel_rate, verify_rate, survey_rate, seed, habit_tasks)
        return ReadEditOracle(task, decoy=writes_decoy(task.id, decoy_rate, seed), parallel=parallel, verify=verify,
                              teach_choice=teaches_choice(task.id, parallel_choice_rate, seed), survey=survey)

    return make


def main() -> None:
    ap = argparse.ArgumentParser(description="Generate demo-family tasks (see the module docstring).")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--exclude-suite", type=Path, help="A suite whose instances must not reappear (held-out split).")
    ap.add_argument("--name", default="demo")
    ap.add_argument("--two-file-rate", type=float, default=0.0, help="Share of two-file tasks (0..1).")
    args = ap.parse_args()
    exclude = {p.name for p in args.exclude_suite.iterdir()} if args.exclude_suite else set()
    paths = generate_tasks(args.n, args.seed, args.out, difficulty=args.difficulty, exclude=exclude, suite_name=args.name,
                           two_file_rate=args.two_file_rate)
    print(f"{len(paths)} tasks in {args.out}")


if __name__ == "__main__":
    main()
