import pytest

from bank.account import Account, InsufficientFunds


def test_account_deposit():
    a = Account("ann")
    a.deposit(500)
    a.deposit(25)
    assert a.balance == 525
    assert a.history == [("deposit", 500), ("deposit", 25)]
    with pytest.raises(ValueError):
        a.deposit(0)
    with pytest.raises(ValueError):
        a.deposit(-5)
    assert a.balance == 525


def test_account_withdraw():
    a = Account("bob", 100)
    a.withdraw(40)
    assert a.balance == 60
    a.withdraw(60)
    assert a.balance == 0
    with pytest.raises(InsufficientFunds):
        a.withdraw(1)
    with pytest.raises(ValueError):
        a.withdraw(-1)
    assert a.history == [("withdraw", 40), ("withdraw", 60)]
