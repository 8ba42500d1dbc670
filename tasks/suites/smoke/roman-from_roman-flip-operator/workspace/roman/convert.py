"""Roman numerals (1..3999)."""

_VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    """Roman numeral for 1 <= n <= 3999; ValueError outside that range."""
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is outside 1..3999")
    out = []
    for value, symbol in _VALUES:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


def from_roman(s):
    """Integer value of a Roman numeral (subtractive notation, e.g. "XIV" == 14)."""
    total = 0
    for i, ch in enumerate(s):
        v = _DIGITS[ch]
        if i + 1 < len(s) and _DIGITS[s[i + 1]] < v:
            total -= v
        else:
            total += v
    return total
