import pytest

from inventory.store import Inventory


def test_inventory_add():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple", 2)
    inv.add("pear", 1)
    assert inv.stock == {"apple": 5, "pear": 1}
    with pytest.raises(ValueError):
        inv.add("pear", 0)


def test_inventory_remove():
    inv = Inventory()
    inv.stock = {"apple": 5, "pear": 1}
    inv.remove("apple", 2)
    assert inv.stock == {"apple": 3, "pear": 1}
    inv.remove("pear", 1)
    assert inv.stock == {"apple": 3}
    with pytest.raises(KeyError):
        inv.remove("plum", 1)
    with pytest.raises(ValueError):
        inv.remove("apple", 4)
