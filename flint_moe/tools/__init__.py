"""Command-line tools: ``python -m flint_moe.tools.<name>``."""
