"""Benchmarks (``nox -s bench`` / ``python -m benchmarks.runner`` on the GPU). Speed targets live here, never
in tests."""
