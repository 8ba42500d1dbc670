"""Closed intervals as (start, end) pairs with start <= end."""


def overlaps(a, b):
    """True if intervals a and b share at least one point."""
    raise NotImplementedError


def merge(intervals):
    """Merge overlapping intervals; the result is sorted by start."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals):
    """Total length covered by the union of the intervals."""
    return sum(end - start for start, end in merge(intervals))
