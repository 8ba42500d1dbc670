"""Identifiers from free text."""

import re


def slugify(text):
    """URL slug: lowercase ASCII letters and digits joined by single hyphens."""
    parts = re.split(r"[^a-z0-9]+", text.lower())
    return "-".join(p for p in parts)


def camel_to_snake(name):
    """Convert CamelCase or camelCase to snake_case ("HTTPServer" -> "http_server")."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()
