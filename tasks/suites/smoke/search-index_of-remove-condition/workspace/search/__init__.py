"""Searching sorted sequences."""
