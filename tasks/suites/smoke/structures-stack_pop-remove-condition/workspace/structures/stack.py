"""A LIFO stack."""


class EmptyError(Exception):
    """Raised when taking an item from an empty container."""


class Stack:
    """Last in, first out."""

    def __init__(self):
        self._items = []

    def push(self, item):
        """Put item on top."""
        self._items.append(item)

    def pop(self):
        """Remove and return the top item; EmptyError if the stack is empty."""
        return self._items.pop()

    def peek(self):
        """The top item, left in place; EmptyError if the stack is empty."""
        if not self._items:
            raise EmptyError("peek at an empty stack")
        return self._items[-1]

    def __len__(self):
        return len(self._items)
