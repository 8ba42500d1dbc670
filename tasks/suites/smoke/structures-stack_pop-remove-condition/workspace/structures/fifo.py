"""A FIFO queue made of two stacks."""

from structures.stack import EmptyError, Stack


class Queue:
    """First in, first out, amortised O(1) per operation."""

    def __init__(self):
        self._in, self._out = Stack(), Stack()

    def put(self, item):
        """Add item at the back."""
        self._in.push(item)

    def get(self):
        """Remove and return the front item; EmptyError if the queue is empty."""
        if not len(self._out):
            while len(self._in):
                self._out.push(self._in.pop())
        if not len(self._out):
            raise EmptyError("get from an empty queue")
        return self._out.pop()

    def __len__(self):
        return len(self._in) + len(self._out)
