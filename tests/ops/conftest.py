"""Fixtures shared by the op tests."""

from __future__ import annotations

import pytest
import torch


def same_taps(a: dict, b: dict) -> None:
    """Assert two tap dicts hold the same names and, per name, the same shape and bits."""
    assert sorted(a) == sorted(b)
    for name, t in a.items():
        u = b[name]
        assert t.shape == u.shape, name
        assert torch.equal(t.contiguous().view(torch.uint8), u.contiguous().view(torch.uint8)), name


@pytest.fixture
def grouped_calls(monkeypatch) -> list:
    """Token counts of every call of the grouped path's launcher (``moe_nvfp4_grouped.launch_grouped``)."""
    import flint_moe.ops.moe_nvfp4_grouped as grouped

    calls: list = []
    real = grouped.launch_grouped

    def spy(*args, **kwargs):
        calls.append(int(args[0].shape[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(grouped, "launch_grouped", spy)
    return calls
