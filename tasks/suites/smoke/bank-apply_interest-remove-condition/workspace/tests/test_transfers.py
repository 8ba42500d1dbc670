import pytest

from bank.account import Account, InsufficientFunds
from bank.transfers import apply_interest, transfer


def test_transfer():
    a, b = Account("ann", 100), Account("bob", 5)
    assert transfer(a, b, 30) == (70, 35)
    with pytest.raises(InsufficientFunds):
        transfer(a, b, 71)
    assert (a.balance, b.balance) == (70, 35)
