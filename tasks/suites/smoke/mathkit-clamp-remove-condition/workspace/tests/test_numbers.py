import pytest

from mathkit.numbers import clamp, gcd, is_prime, mean


def test_gcd():
    assert gcd(12, 18) == 6
    assert gcd(17, 5) == 1
    assert gcd(4, -6) == 2
    assert gcd(-4, -6) == 2
    assert gcd(0, 7) == 7
    assert gcd(0, 0) == 0


def test_is_prime():
    assert [n for n in range(30) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
    assert not is_prime(49)
    assert not is_prime(-7)


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([7]) == 7
    with pytest.raises(ValueError):
        mean([])
