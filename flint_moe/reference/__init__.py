"""Golden model of the Flint MoE numerics rule (docs/numerics.md). Imports torch and numpy only."""
