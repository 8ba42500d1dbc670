"""Turning exam scores into letter grades."""


def letter(score):
    """Letter grade for a score in 0..100: A >= 90, B >= 80, C >= 70, D >= 60, else F."""
    for cutoff, grade in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= cutoff:
            return grade
    return "F"


def histogram(scores):
    """Count of each letter grade, every letter present ({"A": 2, "B": 0, ...})."""
    counts = {g: 0 for g in "ABCDF"}
    for s in scores:
        counts[letter(s)] += 1
    return counts


def median(scores):
    """Median of a non-empty list (the mean of the two middle values for even lengths)."""
    raise NotImplementedError
