import pytest

from roman.convert import from_roman, to_roman


def test_to_roman():
    assert to_roman(1) == "I"
    assert to_roman(4) == "IV"
    assert to_roman(10) == "X"
    assert to_roman(14) == "XIV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)


def test_from_roman():
    assert from_roman("I") == 1
    assert from_roman("IV") == 4
    assert from_roman("XIV") == 14
    assert from_roman("XC") == 90
    assert from_roman("MCMXCIV") == 1994


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 400))
