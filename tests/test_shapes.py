"""flint_moe/shapes.py: the one place a model shape is added; its scaled-down copy keeps top_k, padding and the
divisibility the kernels need; the command-line spelling."""

from __future__ import annotations

import pytest

from flint_moe.shapes import MODEL_SHAPES, MoEShape, parse_shape, sizes_name


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        # E: smallest non-power-of-two >= k + 2; H: 384 for H % 128 == 0, else 128 + H % 128; I: 128 + I % 128
        (MoEShape("a", 256, 7168, 2048, 8, 2048), (10, 384, 128, 8, 128, None)),
        (MoEShape("b", 512, 2048, 512, 10), (12, 384, 128, 10, None, None)),
        (MoEShape("c", 128, 2880, 2880, 4), (6, 192, 192, 4, None, None)),
        (MoEShape("d", 128, 5120, 8192, 1, 8192), (3, 384, 128, 1, 128, None)),
        (MoEShape("e", 8, 4096, 14336, 2), (5, 384, 128, 2, None, None)),
        (MoEShape("f", 4, 4096, 1024, 3), (4, 384, 128, 3, None, None)),  # E capped by the real E
        # padded: I = pad_to + I % pad_to, padded the same way (2880 % 128 = 64 -> 192 stored as 256)
        (MoEShape("g", 128, 2880, 2880, 4, pad_to=128), (6, 192, 192, 4, None, 128)),
        (MoEShape("h", 16, 2080, 1000, 2, pad_to=256), (5, 160, 488, 2, None, 256)),
    ],
)
def test_scaled_down_sizes(shape, want):
    s = shape.scaled_down()
    assert s.name == f"cpu-{shape.name}"
    assert (s.num_experts, s.hidden, s.intermediate, s.top_k, s.shared_intermediate, s.pad_to) == want


def test_scaled_down_keeps_the_divisibility_of_every_model():
    for m in MODEL_SHAPES.values():
        s = m.scaled_down()
        assert s.top_k == m.top_k and s.pad_to == m.pad_to and s.top_k < s.num_experts <= m.num_experts
        assert s.num_experts & (s.num_experts - 1) and s.hidden & (s.hidden - 1), s  # no power of two
        for mod in (32, 64, 128):
            assert (s.hidden % mod == 0) == (m.hidden % mod == 0), (m.name, mod)
            assert (s.stored_intermediate % mod == 0) == (m.stored_intermediate % mod == 0), (m.name, mod)
        assert (s.shared_intermediate is None) == (m.shared_intermediate is None)


def test_parse_shape():
    assert parse_shape("deepseek-v3") is MODEL_SHAPES["deepseek-v3"]
    assert parse_shape("cpu-gpt-oss-120b-p128") == MODEL_SHAPES["gpt-oss-120b-p128"].scaled_down()
    assert parse_shape("6,96,64,3") == MoEShape("E6-H96-I64-k3", 6, 96, 64, 3)
    assert parse_shape(" 10, 160 ,192,3,64") == MoEShape("E10-H160-I192-k3", 10, 160, 192, 3, 64)
    assert sizes_name(6, 96, 48, 3, 64, prefix="cpu") == "cpu-E6-H96-I48-P64-k3"
    for bad in ("6,96,64", "six,96,64,3", "no-such-model", "6,96,64,3,1,1"):
        with pytest.raises(ValueError, match="expected a model name"):
            parse_shape(bad)
    with pytest.raises(ValueError, match="top_k = 7 exceeds num_experts = 6"):
        parse_shape("6,96,64,7")
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        parse_shape("6,0,64,3")


def test_shape_fields_validated():
    with pytest.raises(ValueError, match="pad_to must be None or a positive int"):
        MoEShape("x", 6, 96, 64, 3, pad_to=0)
    assert MoEShape("x", 6, 96, 48, 3, pad_to=64).stored_intermediate == 64
