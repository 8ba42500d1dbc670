"""Roman numerals."""
