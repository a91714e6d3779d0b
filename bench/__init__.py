"""Benchmarks against peers; ``python -m bench`` (``make bench``) runs them all and prints one table."""
