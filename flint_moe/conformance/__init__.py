"""Conformance harness. Filled by later issues."""
