from intervals.ops import merge, overlaps, total_length


def test_overlaps():
    assert overlaps((1, 5), (4, 8))
    assert overlaps((4, 8), (1, 5))
    assert overlaps((1, 5), (5, 6))
    assert overlaps((5, 6), (1, 5))
    assert not overlaps((1, 2), (3, 4))
    assert not overlaps((3, 4), (1, 2))


def test_merge():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]
    assert merge([(8, 10), (1, 3)]) == [(1, 3), (8, 10)]
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
    assert merge([(1, 4), (4, 5)]) == [(1, 5)]
    assert merge([]) == []


def test_total_length():
    assert total_length([(0, 2), (1, 3), (10, 11)]) == 4
    assert total_length([]) == 0
