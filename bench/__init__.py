"""Benchmarks that print one JSON line per result (see bench/append.py)."""
