"""Container data structures."""
