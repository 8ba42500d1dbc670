import pytest

from vectors.vec import Vec2


def test_vec2_add():
    assert Vec2(1, 2) + Vec2(3, -1) == Vec2(4, 1)


def test_vec2_scale():
    assert Vec2(1, -2).scale(3) == Vec2(3, -6)
    assert Vec2(1, 1).scale(0) == Vec2(0, 0)


def test_vec2_dot():
    assert Vec2(1, 2).dot(Vec2(3, 4)) == 11
    assert Vec2(1, 0).dot(Vec2(0, 1)) == 0
    assert Vec2(2, -1).dot(Vec2(1, 3)) == -1


def test_vec2_length():
    assert Vec2(3, 4).length() == 5
    assert Vec2(0, 0).length() == 0


def test_vec2_normalized():
    v = Vec2(3, 4).normalized()
    assert v.x == pytest.approx(0.6)
    assert v.y == pytest.approx(0.8)
    with pytest.raises(ValueError):
        Vec2(0, 0).normalized()
