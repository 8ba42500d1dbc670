"""Gregorian calendar arithmetic without the datetime module."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    """True for Gregorian leap years: divisible by 4, except centuries not divisible by 400."""
    raise NotImplementedError


def days_in_month(year, month):
    """Number of days in month (1-12) of year."""
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]


def day_of_year(year, month, day):
    """1-based ordinal of the date within its year (Jan 1 -> 1, Dec 31 -> 365 or 366)."""
    return sum(days_in_month(year, m) for m in range(1, month)) + day
