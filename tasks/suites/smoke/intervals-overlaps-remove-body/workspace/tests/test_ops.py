from intervals.ops import merge, overlaps, total_length


def test_merge():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]
    assert merge([(8, 10), (1, 3)]) == [(1, 3), (8, 10)]
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
    assert merge([(1, 4), (4, 5)]) == [(1, 5)]
    assert merge([]) == []


def test_total_length():
    assert total_length([(0, 2), (1, 3), (10, 11)]) == 4
    assert total_length([]) == 0
