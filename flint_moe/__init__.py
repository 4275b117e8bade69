"""flint-moe: the Flint MoE numerics rule as a golden model, Hopper kernels, and a conformance harness.

Subpackages:
- ``flint_moe.reference``: pure-PyTorch golden model of ``docs/numerics.md`` (imports torch and numpy only).
- ``flint_moe.kernels``: production Triton / CuTe DSL kernels.
- ``flint_moe.conformance``: the harness comparing the two bit for bit.
- ``flint_moe.tools``: command-line entry points (GPU capture/verify of special functions, demos).
"""

__version__ = "0.1.0"
