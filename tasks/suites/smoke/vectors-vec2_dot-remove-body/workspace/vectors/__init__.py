"""Plane vectors."""
