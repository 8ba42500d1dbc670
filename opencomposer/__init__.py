"""opencomposer: an open implementation of the Composer 2 training system."""

__version__ = "0.1.0"
