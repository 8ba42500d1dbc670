import pytest

from matrix.ops import identity, matmul, transpose


def test_identity():
    assert identity(1) == [[1]]
    assert identity(3) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]
    assert transpose([[1]]) == [[1]]


def test_matmul():
    a = [[1, 2], [3, 4]]
    b = [[5, 6], [7, 8]]
    assert matmul(a, b) == [[19, 22], [43, 50]]
    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]
    assert matmul(a, identity(2)) == a
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])
