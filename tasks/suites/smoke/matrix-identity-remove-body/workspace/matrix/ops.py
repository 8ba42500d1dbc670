"""Matrices as lists of rows."""


def identity(n):
    """The n x n identity matrix."""
    raise NotImplementedError


def transpose(m):
    """Rows become columns."""
    return [list(col) for col in zip(*m)]


def matmul(a, b):
    """Matrix product a @ b; ValueError if the inner dimensions differ."""
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    bt = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
