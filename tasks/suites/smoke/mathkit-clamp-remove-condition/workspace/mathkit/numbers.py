"""Integer and float helpers."""


def clamp(x, lo, hi):
    """Return x limited to the closed interval [lo, hi]."""
    if x > hi:
        return hi
    return x


def gcd(a, b):
    """Greatest common divisor of two integers (always >= 0; gcd(0, 0) == 0)."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def is_prime(n):
    """True if n is a prime number."""
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def mean(xs):
    """Arithmetic mean of a non-empty sequence; ValueError if it is empty."""
    if not xs:
        raise ValueError("mean of an empty sequence")
    return sum(xs) / len(xs)
