"""Axis-aligned rectangles."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Rect:
    """Rectangle with corner (x, y), width w and height h (w, h >= 0)."""

    x: float
    y: float
    w: float
    h: float

    def area(self):
        """Width times height."""
        return self.w * self.h

    def contains(self, px, py):
        """True if the point (px, py) lies inside the rectangle or on its border."""
        return self.x <= px <= self.x + self.w and self.y <= py <= self.y + self.h

    def intersects(self, other):
        """True if the two rectangles overlap with positive area (touching edges do not count)."""
        raise NotImplementedError

    def union_box(self, other):
        """Smallest rectangle containing both."""
        x0, y0 = min(self.x, other.x), min(self.y, other.y)
        x1 = max(self.x + self.w, other.x + other.w)
        y1 = max(self.y + self.h, other.y + other.h)
        return Rect(x0, y0, x1 - x0, y1 - y0)
