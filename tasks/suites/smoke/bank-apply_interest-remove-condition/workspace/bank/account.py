"""Bank accounts with balances in integer cents."""


class InsufficientFunds(Exception):
    """A withdrawal larger than the balance."""


class Account:
    """An account whose balance never goes below zero."""

    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        """Add a positive amount; ValueError if amount <= 0."""
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        """Take out a positive amount; InsufficientFunds if it exceeds the balance."""
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"{self.owner}: balance {self.balance} < {amount}")
        self.balance -= amount
        self.history.append(("withdraw", amount))
