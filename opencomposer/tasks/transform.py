"""Source transformations for the miner: function units, body removal, procedural bugs, test removal.

Everything here is a pure function from source text to source text (libcst keeps comments and
formatting, so diffs stay minimal), plus `function_units`, which lists the functions and
methods a file defines with the line ranges coverage is mapped onto (ast).

    function_units(src)                     -> [Unit]   top-level functions and methods of
                                                        (nested) classes; functions inside
                                                        functions belong to their parent
    remove_bodies(src, keys)                -> src      bodies -> docstring + `raise NotImplementedError`
    mutation_sites(src, key, kind)          -> int      how many places `kind` can break
    mutate(src, key, kind, site)            -> src      one SWE-smith-style procedural bug
    remove_tests(src, qualnames)            -> src      test functions/methods deleted

A unit is named by its key `(qualname, index)`: the index counts earlier defs with the same
qualname in the file (a property's getter and setter share one), so ast and libcst, both
walking the file in source order, agree on which def is meant.

Mutation kinds (after SWE-smith, Yang et al. 2025, "procedural modifications"):

    flip_compare   one comparison operator:  < <-> >,  <= <-> >=,  == <-> !=,  is <-> is not,  in <-> not in
    flip_arith     one binary operator:      + <-> -,  * <-> /  (and their augmented forms)
    remove_if      one `if` statement without an else branch deleted
    remove_loop    one `for` / `while` loop deleted
    swap_branches  the two branches of one `if ... else` swapped

Left out: renames, moved code and other mutations that keep behaviour (they make no task).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst as cst

Key = tuple[str, int]
KINDS = ("flip_compare", "flip_arith", "remove_if", "remove_loop", "swap_branches")
STUB = "raise NotImplementedError"


@dataclass(frozen=True)
class Unit:
    """One function or method of a source file."""

    qualname: str
    index: int
    def_line: int
    """Line of the `def` keyword (decorators are above it)."""
    body_start: int
    """First line of the body after the docstring (0 when the body is only a docstring)."""
    end_line: int
    doc: str
    """The docstring, or ""."""
    is_stub: bool
    """The body is already `...`, `pass` or a bare raise: nothing to remove."""

    @property
    def key(self) -> Key:
        return (self.qualname, self.index)

    @property
    def body_lines(self) -> int:
        return self.end_line - self.body_start + 1 if self.body_start else 0


def function_units(src: str) -> list[Unit]:
    """Every function and method (not nested in another function), in source order."""
    units: list[Unit] = []
    seen: dict[str, int] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + node.name
                index = seen.get(qual, 0)
                seen[qual] = index + 1
                doc = ast.get_docstring(node, clean=True) or ""
                rest = node.body[1:] if _has_doc(node) else node.body
                stub = all(_is_trivial(s) for s in rest)
                units.append(Unit(qual, index, node.lineno, rest[0].lineno if rest else 0,
                                  node.end_lineno or node.lineno, doc, stub))

    visit(ast.parse(src).body, "")
    return units


def _has_doc(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def _is_trivial(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass) or isinstance(stmt, ast.Raise) and stmt.exc is not None:
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis


# ---------------------------------------------------------------- walking defs with libcst


class _DefWalker(cst.CSTTransformer):
    """Tracks the qualname and index of the def being visited (classes nest, functions don't)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.depth_fn = 0
        self.seen: dict[str, int] = {}
        self.current: list[Key | None] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        if self.depth_fn == 0:
            self.stack.append(node.name.value)
        return True

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        if self.depth_fn == 0:
            self.stack.pop()
        return self.fix_class(updated)

    def fix_class(self, updated: cst.ClassDef) -> cst.ClassDef:
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        key = None
        if self.depth_fn == 0:
            qual = ".".join([*self.stack, node.name.value])
            index = self.seen.get(qual, 0)
            self.seen[qual] = index + 1
            key = (qual, index)
        self.current.append(key)
        self.depth_fn += 1
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.depth_fn -= 1
        key = self.current.pop()
        return self.on_def(key, updated) if key is not None else updated

    def on_def(self, key: Key, updated: cst.FunctionDef):
        return updated

    def inside(self) -> Key | None:
        """The key of the outermost def we are in, or None at module/class level."""
        return next((k for k in self.current if k is not None), None)


def _doc_statement(fn: cst.FunctionDef) -> cst.BaseStatement | None:
    body = fn.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return None
    first = body.body[0]
    if (isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))):
        return first
    return None


def _block(stmts: list[cst.BaseStatement], like: cst.BaseSuite) -> cst.IndentedBlock:
    header = like.header if isinstance(like, cst.IndentedBlock) else cst.TrailingWhitespace()
    indent = like.indent if isinstance(like, cst.IndentedBlock) else None
    return cst.IndentedBlock(body=stmts, header=header, indent=indent)


# ---------------------------------------------------------------- body removal


class _BodyRemover(_DefWalker):
    def __init__(self, keys: set[Key]):
        super().__init__()
        self.keys, self.done = keys, set()

    def on_def(self, key: Key, updated: cst.FunctionDef):
        if key not in self.keys:
            return updated
        self.done.add(key)
        doc = _doc_statement(updated)
        stub = cst.parse_statement(STUB + "\n")
        return updated.with_changes(body=_block([doc, stub] if doc else [stub], updated.body))


def remove_bodies(src: str, keys: set[Key] | list[Key]) -> str:
    """Replace the bodies of the given units by their docstring plus `raise NotImplementedError`.

    Signatures, decorators, docstrings and the header comment stay; everything else in the
    body (nested functions included) goes. Raises KeyError naming any key not found.
    """
    keys = set(keys)
    walker = _BodyRemover(keys)
    out = cst.parse_module(src).visit(walker).code
    if keys - walker.done:
        raise KeyError(f"no such function(s): {sorted(keys - walker.done)}")
    return out


# ---------------------------------------------------------------- procedural mutations

_COMPARE_FLIPS = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
                  cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual,
                  cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
                  cst.In: cst.NotIn, cst.NotIn: cst.In}
_ARITH_FLIPS = {cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.Divide, cst.Divide: cst.Multiply,
                cst.AddAssign: cst.SubtractAssign, cst.SubtractAssign: cst.AddAssign,
                cst.MultiplyAssign: cst.DivideAssign, cst.DivideAssign: cst.MultiplyAssign}


def _flip(op, table):
    new = table[type(op)]
    fields = {f: getattr(op, f) for f in ("whitespace_before", "whitespace_after") if hasattr(op, f)}
    if new in (cst.IsNot, cst.NotIn):
        fields["whitespace_between"] = cst.SimpleWhitespace(" ")
    return new(**fields)


class _Mutator(_DefWalker):
    """Counts the sites of one mutation kind inside one def, and applies it at site `site`."""

    def __init__(self, key: Key, kind: str, site: int | None):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown mutation kind {kind!r}; one of {KINDS}")
        self.key, self.kind, self.site, self.count, self.applied = key, kind, site, 0, False
        self.elifs: set[int] = set()

    def visit_If(self, node: cst.If) -> bool:
        if isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))
        return True

    def _hit(self) -> bool:
        """Register one site; True if it is the one to mutate."""
        if self.inside() != self.key:
            return False
        self.count += 1
        if self.count - 1 == self.site:
            self.applied = True
            return True
        return False

    def leave_ComparisonTarget(self, original, updated):
        if self.kind == "flip_compare" and type(updated.operator) in _COMPARE_FLIPS and self._hit():
            return updated.with_changes(operator=_flip(updated.operator, _COMPARE_FLIPS))
        return updated

    def leave_BinaryOperation(self, original, updated):
        if self.kind == "flip_arith" and type(updated.operator) in _ARITH_FLIPS and self._hit():
            return updated.with_changes(operator=_flip(updated.operator, _ARITH_FLIPS))
        return updated

    def leave_AugAssign(self, original, updated):
        if self.kind == "flip_arith" and type(updated.operator) in _ARITH_FLIPS and self._hit():
            return updated.with_changes(operator=_flip(updated.operator, _ARITH_FLIPS))
        return updated

    def leave_If(self, original, updated):
        if self.kind == "remove_if" and updated.orelse is None and id(original) not in self.elifs and self._hit():
            return cst.RemoveFromParent()
        if (self.kind == "swap_branches" and isinstance(updated.orelse, cst.Else)
                and isinstance(updated.body, cst.IndentedBlock) and isinstance(updated.orelse.body, cst.IndentedBlock)
                and self._hit()):
            return updated.with_changes(body=updated.orelse.body, orelse=updated.orelse.with_changes(body=updated.body))
        return updated

    def leave_For(self, original, updated):
        return cst.RemoveFromParent() if self.kind == "remove_loop" and self._hit() else updated

    def leave_While(self, original, updated):
        return cst.RemoveFromParent() if self.kind == "remove_loop" and self._hit() else updated

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:  # the removed statement was the only one
            return updated.with_changes(body=[cst.parse_statement("pass\n")])
        return updated


def mutation_sites(src: str, key: Key, kind: str) -> int:
    """How many places in unit `key` a mutation of `kind` can be applied."""
    walker = _Mutator(key, kind, None)
    cst.parse_module(src).visit(walker)
    return walker.count


def mutate(src: str, key: Key, kind: str, site: int) -> str:
    """Apply mutation `kind` at its `site`-th place (source order) inside unit `key`."""
    walker = _Mutator(key, kind, site)
    out = cst.parse_module(src).visit(walker).code
    if not walker.applied:
        raise KeyError(f"{key}: no site {site} for {kind} ({walker.count} sites)")
    return out


# ---------------------------------------------------------------- hiding tests


class _TestRemover(_DefWalker):
    def __init__(self, qualnames: set[str]):
        super().__init__()
        self.qualnames, self.removed = qualnames, set()

    def on_def(self, key: Key, updated: cst.FunctionDef):
        if key[0] in self.qualnames:
            self.removed.add(key[0])
            return cst.RemoveFromParent()
        return updated

    def fix_class(self, updated: cst.ClassDef) -> cst.ClassDef:
        body = updated.body
        if isinstance(body, cst.IndentedBlock) and not body.body:
            return updated.with_changes(body=body.with_changes(body=[cst.parse_statement("pass\n")]))
        return updated


def remove_tests(src: str, qualnames: set[str]) -> str:
    """Delete the test functions/methods named by qualname ("test_x", "TestY.test_z")."""
    walker = _TestRemover(set(qualnames))
    out = cst.parse_module(src).visit(walker).code
    missing = set(qualnames) - walker.removed
    if missing:
        raise KeyError(f"tests not found: {sorted(missing)}")
    return out
