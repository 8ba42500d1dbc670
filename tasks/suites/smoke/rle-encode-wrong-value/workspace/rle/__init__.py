"""Run-length encoding."""
