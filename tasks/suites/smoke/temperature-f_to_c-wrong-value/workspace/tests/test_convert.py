import pytest

from temperature.convert import c_to_f, describe, f_to_c


def test_c_to_f():
    assert c_to_f(0) == 32
    assert c_to_f(100) == 212
    assert c_to_f(-40) == -40


def test_describe():
    assert describe(-5) == "freezing"
    assert describe(0) == "freezing"
    assert describe(10) == "cold"
    assert describe(15) == "mild"
    assert describe(24.9) == "mild"
    assert describe(25) == "hot"
