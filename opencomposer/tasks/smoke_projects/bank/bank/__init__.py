"""Toy bank accounts."""
