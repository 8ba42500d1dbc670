"""Exam grading."""
