"""Immutable 2-D vectors."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Vec2:
    """A 2-D vector."""

    x: float
    y: float

    def __add__(self, other):
        return Vec2(self.x + other.x, self.y + other.y)

    def scale(self, k):
        """The vector multiplied by the scalar k."""
        return Vec2(self.x * k, self.y * k)

    def dot(self, other):
        """Dot product."""
        raise NotImplementedError

    def length(self):
        """Euclidean length."""
        return math.hypot(self.x, self.y)

    def normalized(self):
        """Unit vector with the same direction; ValueError for the zero vector."""
        n = self.length()
        if n == 0:
            raise ValueError("cannot normalize the zero vector")
        return self.scale(1 / n)
