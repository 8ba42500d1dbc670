"""The miner's source transformations: body removal, procedural bugs, hiding tests (no sandbox)."""

from __future__ import annotations

import ast

import pytest

from opencomposer.tasks.transform import KINDS, function_units, mutate, mutation_sites, remove_bodies, remove_tests

SRC = '''"""A module."""
import math


def area(r):  # circle
    """Area of a circle of radius r.

    Negative radii are rejected.
    """
    # the check comes first
    if r < 0:
        raise ValueError(r)
    return math.pi * r * r


def total(xs):
    s = 0
    for x in xs:
        s += x
    return s


def sign(x): return 1 if x >= 0 else -1


class Box:
    """A box."""

    def __init__(self, w, h):
        self.w, self.h = w, h

    @property
    def size(self):
        """Width times height."""
        def helper():
            return self.w * self.h
        return helper()

    @size.setter
    def size(self, v):
        if v == 0:
            self.w = 0
        else:
            self.w = v / self.h

    def todo(self):
        """Not written yet."""
        ...
'''


def _defs(src: str) -> dict[str, ast.FunctionDef]:
    return {n.name + str(n.lineno): n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}


def test_function_units_name_methods_and_properties_by_qualname_and_index():
    units = {(u.qualname, u.index): u for u in function_units(SRC)}
    assert set(units) == {("area", 0), ("total", 0), ("sign", 0), ("Box.__init__", 0), ("Box.size", 0),
                          ("Box.size", 1), ("Box.todo", 0)}  # helper() is part of Box.size
    area = units[("area", 0)]
    assert area.doc.startswith("Area of a circle") and SRC.splitlines()[area.body_start - 1].strip() == "if r < 0:"
    assert area.body_lines == 3 and not area.is_stub
    assert units[("Box.todo", 0)].is_stub and units[("sign", 0)].body_lines == 1


def test_remove_bodies_keeps_signatures_decorators_and_docstrings_and_compiles():
    out = remove_bodies(SRC, {("area", 0), ("Box.size", 0), ("Box.size", 1), ("sign", 0)})
    compile(out, "m.py", "exec")
    assert 'def area(r):  # circle\n    """Area of a circle of radius r.\n\n    Negative radii are rejected.\n    """\n' \
           "    raise NotImplementedError\n" in out
    assert "def sign(x):\n    raise NotImplementedError\n" in out  # one-liner becomes a block
    assert "@property\n    def size(self):\n        \"\"\"Width times height.\"\"\"\n        raise NotImplementedError" in out
    assert "@size.setter\n    def size(self, v):\n        raise NotImplementedError" in out
    assert "math.pi" not in out and "helper" not in out and "the check comes first" not in out
    assert "s += x" in out and "self.w, self.h = w, h" in out  # untouched functions stay
    # what remains parses to the same defs, with the same arguments and decorators
    before, after = _defs(SRC), _defs(out)
    assert {k.rstrip("0123456789") for k in after} == {k.rstrip("0123456789") for k in before} - {"helper"}


def test_remove_bodies_names_missing_functions():
    with pytest.raises(KeyError, match="nope"):
        remove_bodies(SRC, {("nope", 0)})


@pytest.mark.parametrize("kind, before, after", [
    ("flip_compare", "if r < 0:", "if r > 0:"),
    ("flip_arith", "return math.pi * r * r", "return math.pi / r * r"),
    ("remove_if", "    if r < 0:\n        raise ValueError(r)\n", ""),
])
def test_mutations_of_one_function(kind, before, after):
    n = mutation_sites(SRC, ("area", 0), kind)
    assert n >= 1
    out = mutate(SRC, ("area", 0), kind, 0)
    compile(out, "m.py", "exec")
    assert before in SRC and before not in out.split("def total")[0]
    assert after in out
    assert out.split("def total")[1] == SRC.split("def total")[1]  # only area changed


def test_remove_loop_swap_branches_and_augmented_operators():
    out = mutate(SRC, ("total", 0), "remove_loop", 0)
    assert "for x in xs" not in out and "    s = 0\n    return s\n" in out
    assert mutate(SRC, ("total", 0), "flip_arith", 0).count("s -= x") == 1
    swapped = mutate(SRC, ("Box.size", 1), "swap_branches", 0)
    assert "if v == 0:\n            self.w = v / self.h\n        else:\n            self.w = 0\n" in swapped
    assert mutation_sites(SRC, ("Box.size", 0), "swap_branches") == 0


def test_every_site_of_every_kind_changes_the_code_and_compiles():
    for u in function_units(SRC):
        for kind in KINDS:
            for site in range(mutation_sites(SRC, u.key, kind)):
                out = mutate(SRC, u.key, kind, site)
                compile(out, "m.py", "exec")
                assert ast.dump(ast.parse(out)) != ast.dump(ast.parse(SRC)), (u.key, kind, site)


def test_removing_the_only_statement_leaves_pass():
    src = "def f(xs):\n    for x in xs:\n        print(x)\n"
    assert mutate(src, ("f", 0), "remove_loop", 0) == "def f(xs):\n    pass\n"


def test_comparison_flips_to_two_word_operators():
    src = "def f(a, b):\n    return a in b and a is b\n"
    assert mutate(src, ("f", 0), "flip_compare", 0) == "def f(a, b):\n    return a not in b and a is b\n"
    assert mutate(src, ("f", 0), "flip_compare", 1) == "def f(a, b):\n    return a in b and a is not b\n"


def test_remove_tests_deletes_functions_and_methods_and_keeps_classes_valid():
    src = ("import pytest\n\n\ndef test_a():\n    assert 1\n\n\ndef test_b():\n    assert 2\n\n\n"
           "class TestC:\n    def test_d(self):\n        assert 3\n")
    out = remove_tests(src, {"test_a", "TestC.test_d"})
    compile(out, "t.py", "exec")
    assert "test_a" not in out and "test_b" in out and "class TestC:\n    pass\n" in out
    with pytest.raises(KeyError, match="test_zz"):
        remove_tests(src, {"test_zz"})
