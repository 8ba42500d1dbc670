from inventory.report import low_stock, total_value
from inventory.store import Inventory


def make():
    inv = Inventory()
    inv.stock = {"apple": 5, "pear": 2, "fig": 3}
    return inv


def test_total_value():
    assert total_value(make(), {"apple": 10, "pear": 25, "fig": 40}) == 220
    assert total_value(make(), {"apple": 10}) == 50


def test_low_stock():
    assert low_stock(make(), 3) == ["pear"]
    assert low_stock(make(), 4) == ["fig", "pear"]
    assert low_stock(make(), 1) == []
