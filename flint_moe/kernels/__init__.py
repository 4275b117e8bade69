"""Production kernels (Triton, CuTe DSL). Filled by later issues."""
