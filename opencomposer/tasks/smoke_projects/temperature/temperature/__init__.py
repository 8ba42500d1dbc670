"""Temperatures."""
