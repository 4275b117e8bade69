"""Tensor-core accumulation model against the H200 (``pytest -m gpu tests/kernels/test_mma_probes_gpu.py``).

A fresh random batch of every input class of ``flint_moe.tools.mma`` (a seed the committed report did not use)
through one ``mma.sync.m16n8k16`` and one wgmma k16 step per vector, compared bit for bit (NaN as NaN-ness)
with ``reference.mma_bf16_f32`` run on the GPU; the one-hot fragment check; a K = 32 ``tl.dot`` against the
model applied twice.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.reference import mma_bf16_f32
from flint_moe.tools.mma import CLASSES, generate, same_bits

pytestmark = pytest.mark.gpu

SEED = 2027
N = 20000


def _first_mismatch(acc, a, b, hw, md) -> str:
    i = int((~same_bits(hw, md)).nonzero()[0])
    return f"acc={float(acc[i])!r} a={a[i].tolist()} b={b[i].tolist()} hw={float(hw[i])!r} model={float(md[i])!r}"


def test_fragment_layout_one_hot() -> None:
    from flint_moe.kernels.audit.mma_probes import mma_layout_check

    assert mma_layout_check("cuda") == []


@pytest.mark.parametrize("klass", CLASSES)
@pytest.mark.parametrize("instruction", ["mma.sync.m16n8k16", "wgmma.m64nNk16"])
def test_model_equals_hardware(klass: str, instruction: str) -> None:
    from flint_moe.kernels.audit.mma_probes import MMA_PROBES

    acc, a, b = generate(klass, N, SEED, "cuda")
    hw = MMA_PROBES[instruction](acc, a, b)
    md = mma_bf16_f32(acc, a, b, instruction=instruction)
    ok = same_bits(hw, md)
    assert bool(ok.all()), f"{int((~ok).sum())} of {acc.numel()} differ, e.g. " + _first_mismatch(acc, a, b, hw, md)


def test_mma_sync_equals_wgmma() -> None:
    from flint_moe.kernels.audit.mma_probes import mma_sync_hw, wgmma_hw

    for klass in CLASSES:
        acc, a, b = generate(klass, 5000, SEED + 1, "cuda")
        x, y = mma_sync_hw(acc, a, b), wgmma_hw(acc, a, b)
        assert bool(same_bits(x, y).all()), klass


@pytest.mark.parametrize("klass", ["gaussian", "cancel", "align_shift", "carry"])
def test_k32_dot_is_two_chained_steps(klass: str) -> None:
    from flint_moe.kernels.audit.mma_probes import wgmma_k32_hw

    acc, a1, b1 = generate(klass, N, SEED + 2, "cuda")
    _, a2, b2 = generate(klass, N, SEED + 3, "cuda")
    hw = wgmma_k32_hw(acc, torch.cat([a1, a2], 1), torch.cat([b1, b2], 1))
    md = mma_bf16_f32(mma_bf16_f32(acc, a1, b1), a2, b2)
    assert bool(same_bits(hw, md).all()), _first_mismatch(acc, a1, b1, hw, md)
