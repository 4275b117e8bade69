"""llama.cpp NVFP4 (GGUF type 40) -> ModelOpt layout (flint_moe/checkpoints/gguf.py ``nvfp4_gguf_to_modelopt``):
a hand-derived block, every scale byte against gguf-py's own ``dequantize``, the test writer's inverse, errors.
"""

from __future__ import annotations

import gguf  # the test extra installs it: a missing gguf fails here, it is not skipped
import numpy as np
import pytest
import torch

from flint_moe.checkpoints import nvfp4_gguf_to_modelopt
from flint_moe.reference.quantize import dequantize_nvfp4
from tests.checkpoints._writers import nvfp4_pack


def _gguf_dequantize(raw: torch.Tensor) -> np.ndarray:
    return gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.NVFP4)


def test_type_40_is_in_gguf() -> None:
    # gguf-py 0.19 knows the type and its block (64 values, 36 bytes) and can dequantize (not quantize) it
    assert int(gguf.GGMLQuantizationType.NVFP4) == 40
    assert gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.NVFP4] == (64, 36)


def test_hand_block() -> None:
    # scales d = 0x38 (E4M3 1.0), 0x7F (gguf: 0), 0xB8 (bit 7 ignored by gguf: 1.0), 0x48 (4.0)
    # each sub-block's 8 code bytes: byte j = (low j, high 15 - j), i.e. values v[j] = j, v[8 + j] = 15 - j.
    # ModelOpt pairs v[2i] (low) with v[2i + 1] (high): i < 4 -> (2i, 2i + 1); i >= 4 -> (23 - 2i, 22 - 2i)
    qs = [j | ((15 - j) << 4) for j in range(8)]
    raw = torch.tensor([[0x38, 0x7F, 0xB8, 0x48] + qs * 4], dtype=torch.uint8)
    codes, scales = nvfp4_gguf_to_modelopt(raw)
    want = [0x10, 0x32, 0x54, 0x76, 0xEF, 0xCD, 0xAB, 0x89]
    assert codes.tolist() == [want * 4]
    assert scales.view(torch.uint8).tolist() == [[0x38, 0x00, 0x38, 0x48]]
    w = dequantize_nvfp4(codes, scales, None)
    # sub-block 0 (scale 1): E2M1 of codes 0..7 then codes 15..8 (= -6, -4, -3, -2, -1.5, -1, -0.5, -0)
    assert w[0, :16].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -4, -3, -2, -1.5, -1, -0.5, -0.0]
    assert w[0, 16:32].abs().max().item() == 0  # scale byte 0x7F reads as 0
    assert w[0, 48 + 8].item() == -24.0  # code 15 (-6) x 4
    np.testing.assert_array_equal(w.numpy(), _gguf_dequantize(raw))


def test_every_scale_byte_matches_gguf_dequantize() -> None:
    g = torch.Generator().manual_seed(1)
    E, N, nb = 2, 5, 8  # 2 * 5 * 8 * 4 = 320 scale bytes >= 255
    raw = torch.randint(0, 256, (E, N, nb, 36), generator=g, dtype=torch.uint8)
    raw[..., :4] = (torch.arange(E * N * nb * 4) % 255).to(torch.uint8).reshape(E, N, nb, 4)  # 0x00..0xFE
    raw = raw.reshape(E, N, nb * 36)
    keep = raw.clone()
    codes, scales = nvfp4_gguf_to_modelopt(raw)
    assert torch.equal(raw, keep)  # input not modified
    assert codes.shape == (E, N, nb * 32) and scales.shape == (E, N, nb * 4)
    assert scales.dtype == torch.float8_e4m3fn
    sb = scales.view(torch.uint8)
    assert not bool(((sb & 0x7F) == 0x7F).any())  # never an E4M3 NaN byte
    assert bool((sb < 0x80).all())  # gguf's scales are unsigned
    w = dequantize_nvfp4(codes, scales, None)
    ref = _gguf_dequantize(raw).reshape(E, N, nb * 64)
    np.testing.assert_array_equal(w.numpy(), ref)  # == (ModelOpt's code 8 is -0.0, gguf's +0)


def test_writer_inverse() -> None:
    # the test writer (llama.cpp's repack restated) and the reader are inverse on ModelOpt data without sign bits
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 256, (7, 128), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 0x7F, (7, 16), generator=g, dtype=torch.uint8)
    raw = torch.from_numpy(nvfp4_pack(codes, scales.view(torch.float8_e4m3fn)))
    assert raw.shape == (7, 4 * 36)
    c2, s2 = nvfp4_gguf_to_modelopt(raw)
    assert torch.equal(c2, codes) and torch.equal(s2.view(torch.uint8), scales)


def test_errors() -> None:
    raw = torch.zeros(2, 72, dtype=torch.uint8)
    raw[1, 36 + 2] = 0xFF
    with pytest.raises(ValueError, match=r"^raw: UE4M3 scale byte 0xFF at block index \(1, 1, 2\).*480"):
        nvfp4_gguf_to_modelopt(raw)
    with pytest.raises(ValueError, match=r"^w: row length \(70,\) bytes must be a positive multiple of 36"):
        nvfp4_gguf_to_modelopt(torch.zeros(2, 70, dtype=torch.uint8), "w")
    with pytest.raises(TypeError, match=r"^raw: dtype must be torch.uint8"):
        nvfp4_gguf_to_modelopt(torch.zeros(2, 72, dtype=torch.int8))
