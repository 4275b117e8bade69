"""Tuning sweeps of the kernels' launch configurations (device runs; they write the tuned tables)."""
