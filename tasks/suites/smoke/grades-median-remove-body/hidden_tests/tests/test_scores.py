from grades.scores import histogram, letter, median


def test_letter():
    assert letter(95) == "A"
    assert letter(90) == "A"
    assert letter(89.5) == "B"
    assert letter(80) == "B"
    assert letter(70) == "C"
    assert letter(60) == "D"
    assert letter(59) == "F"
    assert letter(0) == "F"


def test_histogram():
    assert histogram([95, 85, 91, 10]) == {"A": 2, "B": 1, "C": 0, "D": 0, "F": 1}
    assert histogram([]) == {"A": 0, "B": 0, "C": 0, "D": 0, "F": 0}


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median([7]) == 7
