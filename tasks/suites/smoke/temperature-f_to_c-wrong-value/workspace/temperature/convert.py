"""Temperature conversions and labels."""


def c_to_f(c):
    """Celsius to Fahrenheit."""
    return c * 9 / 5 + 32


def f_to_c(f):
    """Fahrenheit to Celsius."""
    return f - 32 * 5 / 9


def describe(c):
    """Label a Celsius temperature: "freezing" (<= 0), "cold" (< 15), "mild" (< 25), else "hot"."""
    if c <= 0:
        return "freezing"
    if c < 15:
        return "cold"
    if c < 25:
        return "mild"
    return "hot"
