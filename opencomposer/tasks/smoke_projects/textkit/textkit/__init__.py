"""Text utilities."""
