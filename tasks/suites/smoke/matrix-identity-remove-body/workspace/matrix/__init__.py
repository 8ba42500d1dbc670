"""Dense matrices."""
