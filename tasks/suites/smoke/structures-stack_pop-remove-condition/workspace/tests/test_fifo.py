import pytest

from structures.fifo import Queue
from structures.stack import EmptyError


def test_queue_put():
    q = Queue()
    q.put(1)
    q.put(2)
    assert len(q) == 2


def test_queue_get():
    q = Queue()
    q.put(1)
    q.put(2)
    assert q.get() == 1
    q.put(3)
    assert [q.get(), q.get()] == [2, 3]
    with pytest.raises(EmptyError):
        q.get()
