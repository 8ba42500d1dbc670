import pytest

from structures.stack import EmptyError, Stack


def test_stack_push():
    s = Stack()
    s.push(1)
    s.push("two")
    assert len(s) == 2


def test_stack_peek():
    s = Stack()
    with pytest.raises(EmptyError):
        s.peek()
    s.push("a")
    s.push("b")
    assert s.peek() == "b"
    assert len(s) == 2
