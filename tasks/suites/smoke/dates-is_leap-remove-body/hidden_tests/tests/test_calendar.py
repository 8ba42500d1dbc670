from dates.calendar import day_of_year, days_in_month, is_leap


def test_is_leap():
    assert is_leap(2024)
    assert is_leap(2000)
    assert not is_leap(2023)
    assert not is_leap(1900)
    assert not is_leap(2100)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 2, 1) == 32
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2024, 12, 31) == 366
    assert day_of_year(2024, 3, 1) == 61
