"""Binary search on sorted lists."""


def lower_bound(xs, x):
    """First index i with xs[i] >= x (len(xs) if there is none)."""
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def index_of(xs, x):
    """Index of the first occurrence of x in sorted xs, or -1 if absent."""
    i = lower_bound(xs, x)
    if xs[i] == x:
        return i
    return -1


def count_in_range(xs, lo, hi):
    """How many elements of the sorted integer list xs lie in the closed range [lo, hi]."""
    return max(0, lower_bound(xs, hi + 1) - lower_bound(xs, lo))
