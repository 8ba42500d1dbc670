"""Matrices as lists of rows."""


def identity(n):
    """The n x n identity matrix."""
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    """Rows become columns."""
    return [list(col) for col in zip(*m)]


def matmul(a, b):
    """Matrix product a @ b; ValueError if the inner dimensions differ."""
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    bt = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
