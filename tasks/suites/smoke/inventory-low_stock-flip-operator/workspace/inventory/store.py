"""Stock levels by item name."""


class Inventory:
    """Quantities of items; an item whose quantity reaches zero is dropped."""

    def __init__(self):
        self.stock = {}

    def add(self, item, qty):
        """Add qty (> 0) units of item; ValueError otherwise."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.stock[item] = self.stock.get(item, 0) + qty

    def remove(self, item, qty):
        """Remove qty units of item; KeyError if it is unknown, ValueError if there are fewer."""
        if item not in self.stock:
            raise KeyError(item)
        if qty > self.stock[item]:
            raise ValueError(f"only {self.stock[item]} {item} left")
        self.stock[item] -= qty
        if self.stock[item] == 0:
            del self.stock[item]
