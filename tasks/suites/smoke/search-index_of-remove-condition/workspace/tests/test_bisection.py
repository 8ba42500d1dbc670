from search.bisection import count_in_range, index_of, lower_bound


def test_lower_bound():
    xs = [1, 3, 3, 3, 7, 9]
    assert lower_bound(xs, 3) == 1
    assert lower_bound(xs, 4) == 4
    assert lower_bound(xs, 0) == 0
    assert lower_bound(xs, 10) == 6
    assert lower_bound([], 5) == 0


def test_count_in_range():
    xs = [1, 2, 2, 5, 7, 7, 9]
    assert count_in_range(xs, 2, 7) == 5
    assert count_in_range(xs, 3, 4) == 0
    assert count_in_range(xs, 9, 20) == 1
    assert count_in_range(xs, 8, 3) == 0
