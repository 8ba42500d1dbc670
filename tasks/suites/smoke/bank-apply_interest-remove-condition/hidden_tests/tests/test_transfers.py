import pytest

from bank.account import Account, InsufficientFunds
from bank.transfers import apply_interest, transfer


def test_transfer():
    a, b = Account("ann", 100), Account("bob", 5)
    assert transfer(a, b, 30) == (70, 35)
    with pytest.raises(InsufficientFunds):
        transfer(a, b, 71)
    assert (a.balance, b.balance) == (70, 35)


def test_apply_interest():
    a = Account("ann", 1050)
    assert apply_interest(a, 10) == 105
    assert a.balance == 1155
    small = Account("bob", 5)
    assert apply_interest(small, 10) == 0
    assert small.balance == 5
