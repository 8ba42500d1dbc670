"""Summaries of an inventory."""


def total_value(inventory, prices):
    """Sum of quantity * price over all items; items without a price count as 0."""
    return sum(qty * prices.get(item, 0) for item, qty in inventory.stock.items())


def low_stock(inventory, threshold):
    """Sorted names of the items whose quantity is below threshold."""
    return sorted(item for item, qty in inventory.stock.items() if qty <= threshold)
