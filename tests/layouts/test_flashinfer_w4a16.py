"""``FlintMoEWeights`` (flint_moe/layouts/flashinfer_w4a16.py): immutable, constructor checks of metadata and
values (global scales, E4M3 NaN scale bytes), ``check_metadata`` after in-place changes, fake tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flint_moe.layouts import FlintMoEWeights
from flint_moe.layouts.flashinfer_w4a16 import TENSOR_FIELDS
from tests.layouts._gen import nvfp4

E, H, I = 3, 128, 64  # noqa: E741


def _fields() -> dict:
    w13, s13, w2, s2 = nvfp4(E, H, I, 1)
    gs = torch.tensor([0.5, 0.0, 2.0])  # +0.0 is a valid global scale
    w = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)
    return {n: getattr(w, n) for n in TENSOR_FIELDS} | {"valid_intermediate": I}


def test_fields_are_frozen_and_replace_checks_again() -> None:
    w = FlintMoEWeights(**_fields())
    for name in (*TENSOR_FIELDS, "valid_intermediate", "w1_sf"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(w, name, getattr(w, name))
    with pytest.raises(ValueError, match=r"^w2: dimension 0 must be 3, got 2"):
        dataclasses.replace(w, w2=w.w2[:2].clone())
    w2 = dataclasses.replace(w, w2_alpha=torch.ones(E))
    assert w2.w1 is w.w1 and w2.w1_sf.data_ptr() == w.w1_sf_swizzled.data_ptr() and w2 != w


@pytest.mark.parametrize("field", ["w1_alpha", "w2_alpha"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1.0, -0.0, -(2.0**-149)])
def test_constructor_rejects_bad_global_scales(field, value) -> None:
    kw = _fields()
    kw[field] = torch.tensor([1.0, value, 1.0])
    with pytest.raises(ValueError, match=rf"^{field}: global scales must be finite and >= \+0.0 \(sign bit clear\), "
                       rf"expert 1 has {repr(value).replace('(', '').replace(')', '')}$"):  # fmt: skip
        FlintMoEWeights(**kw)


@pytest.mark.parametrize("field", ["w1_sf_swizzled", "w2_sf_swizzled"])
@pytest.mark.parametrize("byte", [0x7F, 0xFF])
@pytest.mark.parametrize("where", [(1, 3, 2), (2, -1, -1)])  # a real scale, and the last (padding) byte
def test_constructor_rejects_nan_scale_bytes(field, byte, where) -> None:
    kw = _fields()
    t = kw[field].clone()
    t.view(torch.uint8)[where] = byte
    kw[field] = t
    idx = tuple(i % n for i, n in zip(where, t.shape, strict=True))
    with pytest.raises(ValueError, match=rf"^{field}: contains E4M3 NaN scale bytes .* {idx}".replace(" (", r" \(")
                       .replace(")", r"\)")):  # fmt: skip
        FlintMoEWeights(**kw)


def test_constructor_checks_devices_contiguity_and_sizes() -> None:
    kw = _fields()
    with pytest.raises(ValueError, match=r"^w2_alpha: on meta, but w1 is on cpu"):
        FlintMoEWeights(**(kw | {"w2_alpha": torch.ones(E, device="meta")}))
    with pytest.raises(ValueError, match=r"^w2: must be contiguous"):
        FlintMoEWeights(**(kw | {"w2": torch.cat([kw["w2"], kw["w2"]], 2)[..., ::2]}))
    with pytest.raises(ValueError, match=r"^valid_intermediate: 65 must be an int in \(0, 64\]"):
        FlintMoEWeights(**(kw | {"valid_intermediate": 65}))
    with pytest.raises(ValueError, match=r"^valid_intermediate: True must be an int"):
        FlintMoEWeights(**(kw | {"valid_intermediate": True}))
    with pytest.raises(TypeError, match=r"^w1_sf_swizzled: dtype must be torch.float8_e4m3fn, got torch.uint8"):
        FlintMoEWeights(**(kw | {"w1_sf_swizzled": kw["w1_sf_swizzled"].view(torch.uint8)}))
    with pytest.raises(ValueError, match=r"^w1: expected \[E >= 1, 2Ip, H/2\] with 2Ip a positive multiple of 128"):
        FlintMoEWeights(**(kw | {"w1": kw["w1"][:, :64].contiguous()}))


def test_from_modelopt_rejects_negative_zero_global_scale() -> None:
    w13, s13, w2, s2 = nvfp4(E, H, I, 1)
    with pytest.raises(ValueError, match=r"^w2_scale_2: global scales .* expert 2 has -0.0$"):
        FlintMoEWeights.from_modelopt(w13, s13, torch.ones(E), w2, s2, torch.tensor([1.0, 1.0, -0.0]))


def test_check_metadata_sees_in_place_changes() -> None:
    w = FlintMoEWeights(**_fields())
    w.check_metadata()
    w.w2_alpha.data = torch.ones(E, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^weights\.w2_alpha: dtype must be torch.float32, got torch.float64"):
        w.check_metadata()
    w = FlintMoEWeights(**_fields())
    w.w2_sf_swizzled.data = torch.zeros_like(w.w2_sf_swizzled)
    with pytest.raises(ValueError, match=r"^layer\.w2_sf: no longer the MMA view of layer\.w2_sf_swizzled"):
        w.check_metadata("layer")


def test_fake_tensors_skip_the_value_checks() -> None:
    """Shape propagation (the conformance launch recorder) builds weights from fake tensors: no data to read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = _fields()
    with FakeTensorMode():
        kw = {n: torch.empty(real[n].shape, dtype=real[n].dtype) for n in TENSOR_FIELDS}
        w = FlintMoEWeights(**kw, valid_intermediate=I)
        w.check_metadata()
    assert w.num_experts == E and w.hidden_size == H and w.intermediate_size == I


def test_refresh_copies_in_place_after_checking_everything() -> None:
    w = FlintMoEWeights(**_fields())
    ptrs = {n: getattr(w, n).data_ptr() for n in TENSOR_FIELDS}
    new_alpha = torch.tensor([1.0, 2.0, 4.0])
    new_w2 = torch.full_like(w.w2, 0x21)
    assert w.refresh_(w2=new_w2, w1_alpha=new_alpha) is w
    assert {n: getattr(w, n).data_ptr() for n in TENSOR_FIELDS} == ptrs  # same storage: graphs stay valid
    assert torch.equal(w.w2, new_w2) and torch.equal(w.w1_alpha, new_alpha)
    assert w.w2 is not new_w2 and new_alpha.tolist() == [1.0, 2.0, 4.0]  # arguments only read
    before = w.w2_alpha.clone()
    bad_sf = w.w2_sf_swizzled.clone()
    bad_sf.view(torch.uint8)[0, 0, 0] = 0x7F
    with pytest.raises(ValueError, match="w2_sf_swizzled"):
        w.refresh_(w2_alpha=torch.ones(E), w2_sf_swizzled=bad_sf)
    assert torch.equal(w.w2_alpha, before)  # a refused refresh writes nothing
    with pytest.raises(ValueError, match="w1_alpha"):
        w.refresh_(w1_alpha=torch.tensor([1.0, -0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^w2: expected shape"):
        w.refresh_(w2=w.w2[:2].clone())
    with pytest.raises(TypeError, match=r"^w1: expected dtype"):
        w.refresh_(w1=w.w1.to(torch.int8))
    with pytest.raises(TypeError, match="unknown field"):
        w.refresh_(w3=w.w2)


def test_nan_bytes_in_scale_padding_are_accepted() -> None:
    """Padding of the swizzled scales (here: the padded intermediate rows / columns, I = 64 stored as 128) is never
    read by the kernels and may hold any byte; a NaN byte in a data position is refused."""
    w13, s13, w2, s2 = nvfp4(E, H, I, 1)
    gs = torch.tensor([0.5, 1.0, 2.0])
    w = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs, pad_intermediate_to=128)
    for n in ("w1_sf_swizzled", "w2_sf_swizzled"):
        mask = w.scale_data_mask(n).expand_as(getattr(w, n))
        assert 0 < int(mask.sum()) < mask.numel()  # data and padding both present
        poisoned = getattr(w, n).clone()
        poisoned.view(torch.uint8)[~mask] = 0x7F
        dataclasses.replace(w, **{n: poisoned})  # accepted
        bad = poisoned.clone()
        first = mask.nonzero()[0].tolist()
        bad.view(torch.uint8)[tuple(first)] = 0xFF
        with pytest.raises(ValueError, match=rf"^{n}: contains E4M3 NaN scale bytes"):
            dataclasses.replace(w, **{n: bad})
    with pytest.raises(ValueError, match="scale_data_mask"):
        w.scale_data_mask("w1")
