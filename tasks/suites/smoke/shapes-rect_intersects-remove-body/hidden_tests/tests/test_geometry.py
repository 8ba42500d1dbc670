from shapes.geometry import Rect


def test_rect_area():
    assert Rect(0, 0, 3, 4).area() == 12
    assert Rect(5, 5, 0, 9).area() == 0


def test_rect_contains():
    r = Rect(1, 1, 2, 2)
    assert r.contains(2, 2)
    assert r.contains(1, 1)
    assert r.contains(3, 3)
    assert r.contains(1, 2)
    assert not r.contains(0, 2)
    assert not r.contains(2, 3.5)


def test_rect_intersects():
    a = Rect(0, 0, 2, 2)
    assert a.intersects(Rect(1, 1, 2, 2))
    assert a.intersects(Rect(0.5, 0.5, 0.5, 0.5))
    assert not a.intersects(Rect(3, 3, 1, 1))
    assert not Rect(1, 0, 1, 1).intersects(Rect(0, 0, 1, 1))
    assert not Rect(0, 1, 1, 1).intersects(Rect(0, 0, 1, 1))


def test_rect_union_box():
    assert Rect(0, 0, 1, 1).union_box(Rect(2, 3, 1, 1)) == Rect(0, 0, 3, 4)
    assert Rect(0, 0, 4, 4).union_box(Rect(1, 1, 1, 1)) == Rect(0, 0, 4, 4)
