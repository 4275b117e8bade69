"""FlashInfer CuTe-DSL W4A16 backend (SM100/SM103): argument preparation on the CPU, clear errors elsewhere."""

from __future__ import annotations

import inspect

import pytest
import torch

from flint_moe.kernels.cute.backend import (
    CuteBackendUnavailable,
    cute_backend_status,
    prepare_cute_args,
    run_cute_grouped,
)

from ._nvfp4_check import make_inputs, make_weights

BACKEND = "any"


def test_prepare_args_pairs_as_rows():
    E, H, I, M, k = 5, 96, 64, 4, 3
    w = make_weights(E, H, I, seed=2)
    x, ids, _tw, _sh = make_inputs(M, H, E, k, seed=2)
    x0 = x.clone()
    a = prepare_cute_args(x, ids, w)
    assert a["x"].shape == (M * k, H) and a["x"].dtype == torch.bfloat16
    for t in range(M):
        for j in range(k):
            assert torch.equal(a["x"][t * k + j].view(torch.int16), x[t].view(torch.int16))
    assert torch.equal(a["token_selected_experts"], ids.reshape(M * k, 1))
    assert a["token_selected_experts"].dtype == torch.int32
    assert torch.equal(a["token_final_scales"], torch.ones(M * k, 1))
    assert a["top_k"] == 1 and a["num_experts"] == E and a["quant_mode"] == "w4a16"
    assert a["x_sf"] is None and a["fc2_input_scale"] is None and a["use_fused_finalize"] is False
    # the weights' own tensors (no copies); scales in the MMA view FlashInfer reads
    assert a["w1_weight"] is w.w1 and a["w2_weight"] is w.w2
    assert a["w1_weight_sf"] is w.w1_sf and a["w2_weight_sf"] is w.w2_sf
    assert a["w1_weight_sf"].data_ptr() == w.w1_sf_swizzled.data_ptr()
    assert a["w1_alpha"] is w.w1_alpha and a["w2_alpha"] is w.w2_alpha
    assert torch.equal(x, x0)


def test_args_match_flashinfer_signature():
    """Every prepared keyword is a parameter of flashinfer 0.7.4's cute_dsl_fused_moe (CPU import only)."""
    fm = pytest.importorskip("flashinfer.fused_moe")
    params = inspect.signature(fm.cute_dsl_fused_moe).parameters
    w = make_weights(3, 64, 64, seed=4)
    x, ids, _tw, _sh = make_inputs(2, 64, 3, 2, seed=4)
    assert set(prepare_cute_args(x, ids, w)) <= set(params)


def test_unavailable_here_with_reason():
    ok, why = cute_backend_status("cpu")
    assert not ok and "SM100/SM103" in why
    w = make_weights(3, 64, 64, seed=5)
    x, ids, tw, sh = make_inputs(2, 64, 3, 2, seed=5)
    with pytest.raises(CuteBackendUnavailable, match="SM100/SM103"):
        run_cute_grouped(x, ids, tw, w, sh)


@pytest.mark.gpu
def test_unavailable_on_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("checks the sm_90 message")
    ok, why = cute_backend_status("cuda")
    assert not ok and "sm_90" in why


def test_prepare_args_errors():
    w = make_weights(3, 64, 64, seed=6)
    x, ids, _tw, _sh = make_inputs(2, 64, 3, 2, seed=6)
    with pytest.raises(TypeError, match="^x"):
        prepare_cute_args(x.float(), ids, w)
    with pytest.raises(ValueError, match="^ids"):
        prepare_cute_args(x, ids[:1].contiguous(), w)
    with pytest.raises(TypeError, match="^weights"):
        prepare_cute_args(x, ids, object())
