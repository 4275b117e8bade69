"""NVFP4 decode kernels under Triton's interpreter (CPU CI): golden model fed the kernels' own taps.

Small shapes with the production shapes' divisibility: E, H, k not powers of two, I a multiple of 64 (and a
padded I = 176 -> 192), K steps that leave a partial last step. Order-free steps (global scale, SwiGLU, bf16
casts, combine, shared add) are compared bit for bit; accumulators against the certified bound of the
kernels' documented grouping (block model, B = 16). The interpreter's arithmetic is numpy's (no FMA
contraction, pairwise ``tl.sum``): bit-exactness of the accumulators themselves is a GPU claim
(tests/kernels/test_nvfp4_decode_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.decode_ptx import decode_probe
from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
from flint_moe.reference.exact import FP32_TRUNCATE, block_model
from flint_moe.reference.formats import E2M1_VALUES
from flint_moe.reference.layouts import cutedsl_w13_phys_rows, swizzle_offsets

from ._nvfp4_check import check_taps as _check_taps, make_inputs, make_weights, same

BACKEND = "interpreter"

# Interpreter configs: few, large programs (the interpreter pays per program); BKB small enough that the
# K loop has full steps and a partial last step (H/2 = 80 bytes = 2 x 32 + 16; I/2 = 96 = 64 + 32).
# The CUDA-core path is pinned here (MMA False); the tensor-core path has its own tests below.
GU = {"MMA": False, "BN": 64, "BKB": 32, "num_warps": 1}
DN = {"MMA": False, "BH": 64, "BKB": 64, "num_warps": 1}
BLOCK16 = block_model(16)


#: Complete tensor-core configurations (every MMA key given: nothing inherited from the current defaults).
MMA_KEYS = {"SK": 1, "FENCE": False}
DN_KEYS = {"EARLY": 0, "MAXNREG": 0}  # down only
GU_MMA = {"MMA": True, "BN": 8, "num_warps": 1, "RT": 2, "S": 2, **MMA_KEYS}
DN_MMA = {"MMA": True, "BH": 16, "num_warps": 1, "RT": 2, "S": 2, **MMA_KEYS, **DN_KEYS}


def check_taps(*args, **kwargs):
    """``_nvfp4_check.check_taps`` with the CUDA-core path's block model (the configs above)."""
    return _check_taps(*args, gu_model=BLOCK16, dn_model=BLOCK16, **kwargs)


def _run(w, x, ids, tw, sh, taps=None):
    act = nvfp4_gate_up(x, ids, w, taps=taps, config=GU)
    return nvfp4_down(act, ids, tw, w, sh, taps=taps, config=DN)


def test_decode_all_bytes():
    """Every code byte decodes to the exact E2M1 values of its two nibbles (low nibble = even element)."""
    codes = torch.arange(256, dtype=torch.uint8)
    lo, hi = decode_probe(codes)
    vals = torch.tensor([*E2M1_VALUES], dtype=torch.float32)
    assert same(lo, vals[codes.long() & 15]) and same(hi, vals[codes.long() >> 4])


def test_kernels_match_golden_from_taps_and_production():
    E, H, I, M, k = 5, 160, 192, 2, 3
    w = make_weights(E, H, I, seed=1)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=1)
    x0, ids0, tw0, sh0 = (t.clone() for t in (x, ids, tw, sh))
    taps = {}
    out = _run(w, x, ids, tw, sh, taps)
    counts = check_taps(w, x, ids, tw, sh, taps, out)
    assert counts["pairs"] == M * k
    # inputs never modified
    for a, b in ((x, x0), (ids, ids0), (tw, tw0), (sh, sh0)):
        assert same(a, b)
    # production build (no taps) gives the same bits
    prod = _run(w, x, ids, tw, sh)
    assert same(prod, out)
    assert same(nvfp4_gate_up(x, ids, w, config=GU).view(M, k, I), taps["act"])
    # warps and rows per program change no operation and no order: same bits
    act = nvfp4_gate_up(x, ids, w, config={**GU, "BN": 16, "num_warps": 2})
    assert same(act.view(M, k, I), taps["act"])
    assert same(nvfp4_down(act, ids, tw, w, sh, config={**DN, "BH": 32, "num_warps": 2}), out)
    # the split down's arrival counters are back at 0 (the next call starts clean) and give the same bits again
    assert same(_run(w, x, ids, tw, sh), out)


def _poison(w, byte: int):
    """Copy of ``w`` with every padding byte (swizzle and per-half intermediate padding) set to ``byte``."""
    E, H, ip, inter = w.num_experts, w.hidden_size, w.intermediate_size, w.valid_intermediate
    w1 = w.w1.clone()
    w2 = w.w2.clone()
    s1 = w.w1_sf_swizzled.view(torch.uint8).clone()
    s2 = w.w2_sf_swizzled.view(torch.uint8).clone()
    phys = cutedsl_w13_phys_rows(inter, ip)
    pad_rows = torch.ones(2 * ip, dtype=torch.bool)
    pad_rows[phys] = False
    w1[:, pad_rows] = byte
    w2[:, :, inter // 2 :] = byte
    used1 = torch.zeros(s1[0].numel(), dtype=torch.bool)
    used1[swizzle_offsets(2 * ip, H // 16)[phys].reshape(-1)] = True
    used2 = torch.zeros(s2[0].numel(), dtype=torch.bool)
    used2[swizzle_offsets(H, inter // 16).reshape(-1)] = True
    s1.view(E, -1)[:, ~used1] = byte
    s2.view(E, -1)[:, ~used2] = byte
    assert (~used1).any() and (~used2).any() and pad_rows.any()
    out = type(w)(w1, s1.view(torch.float8_e4m3fn), w.w1_alpha, w2, s2.view(torch.float8_e4m3fn), w.w2_alpha, inter)
    return out


@pytest.mark.parametrize("byte", [0x7F, 0xFF, 0x7E])
def test_poisoned_padding_changes_nothing(byte):
    E, H, I, M, k = 3, 96, 176, 1, 2  # I = 176 padded per half to 192; H/16 = 6 scale columns -> 8
    w = make_weights(E, H, I, seed=2, pad_to=64)
    assert w.intermediate_size == 192
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=2)
    taps = {}
    out = _run(w, x, ids, tw, sh, taps)
    check_taps(w, x, ids, tw, sh, taps, out, accumulators=False)
    assert same(_run(_poison(w, byte), x, ids, tw, sh), out)


def test_asymmetric_gate_up():
    """Expert 0 has all-zero up codes, expert 1 all-zero gate codes: the kernel must read the halves apart."""
    E, H, I, M, k = 3, 96, 128, 1, 3
    w = make_weights(E, H, I, seed=3)
    rows = cutedsl_w13_phys_rows(I, I)
    w.w1[0, rows[I:]] = 0  # up rows of expert 0
    w.w1[1, rows[:I]] = 0  # gate rows of expert 1
    x, _, tw, sh = make_inputs(M, H, E, k, seed=3)
    ids = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    taps = {}
    out = _run(w, x, ids, tw, sh, taps)
    check_taps(w, x, ids, tw, sh, taps, out)
    assert bool((taps["up_acc"][0, 0] == 0).all()) and bool((taps["gate_acc"][0, 0] != 0).any())
    assert bool((taps["gate_acc"][0, 1] == 0).all()) and bool((taps["up_acc"][0, 1] != 0).any())
    assert bool((taps["act"][0, 0] == 0).all()) and bool((taps["act"][0, 1] == 0).all())


def test_bad_inputs_raise():
    from flint_moe.ops.moe_nvfp4 import DECODE_MAX_TOKENS, flint_moe

    E, H, I, M, k = 3, 96, 64, 1, 2
    w = make_weights(E, H, I, seed=4)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=4)
    with pytest.raises(TypeError, match="^x"):
        nvfp4_gate_up(x.float(), ids, w)
    with pytest.raises(ValueError, match="^x"):
        nvfp4_gate_up(torch.zeros(M, H + 32, dtype=torch.bfloat16), ids, w)
    with pytest.raises(ValueError, match="^x.*contiguous"):
        nvfp4_gate_up(torch.zeros(H, 2, dtype=torch.bfloat16).t(), ids.expand(2, k), w)
    with pytest.raises(TypeError, match="^ids"):
        nvfp4_gate_up(x, ids.long(), w)
    with pytest.raises(TypeError, match="^weights"):
        nvfp4_gate_up(x, ids, object())
    act = torch.zeros(M * k, I, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="^tw"):
        nvfp4_down(act, ids, tw.double(), w, sh)
    with pytest.raises(ValueError, match="^act"):
        nvfp4_down(act[:1], ids, tw, w, sh)
    with pytest.raises(ValueError, match="^shared_output"):
        nvfp4_down(act, ids, tw, w, sh[:, :32])
    with pytest.raises(ValueError, match="BN"):
        nvfp4_gate_up(x, ids, w, config={"BN": 3, "MMA": False})
    with pytest.raises(ValueError, match="BN"):  # MMA: 2 * BN * SK must be 8 * num_warps * RT
        nvfp4_gate_up(x, ids, w, config={**GU_MMA, "BN": 16})
    with pytest.raises(ValueError, match=r"\(RT, S\) = \(4, 2\)"):
        nvfp4_gate_up(x, ids, w, config={**GU_MMA, "BN": 16, "RT": 4})
    with pytest.raises(ValueError, match=r"\(RT, S\) = \(2, 1\)"):
        nvfp4_down(act, ids, tw, w, sh, config={**DN_MMA, "S": 1})
    with pytest.raises(ValueError, match="SK"):
        nvfp4_down(act, ids, tw, w, sh, config={**DN_MMA, "SK": 3})
    with pytest.raises(ValueError, match=r"config EARLY: 2 must be one of \[0, 1\]"):
        nvfp4_down(act, ids, tw, w, sh, config={**DN, "EARLY": 2})
    with pytest.raises(ValueError, match="config MAXNREG: 8 must be 0"):
        nvfp4_down(act, ids, tw, w, sh, config={**DN_MMA, "MAXNREG": 8})
    with pytest.raises(ValueError, match="unknown config keys \\['BM'\\]"):
        nvfp4_gate_up(x, ids, w, config={**GU, "BM": 16})
    # the keys of launch variants that lost their measurements are refused by name
    for key, value in (("SPLIT", False), ("PF", True), ("RB", 2), ("DECODE", 1), ("WORDS", True)):
        with pytest.raises(ValueError, match=rf"nvfp4_down: config keys \['{key}'\] belong to removed"):
            nvfp4_down(act, ids, tw, w, sh, config={**DN_MMA, key: value})
    with pytest.raises(ValueError, match=r"nvfp4_gate_up: config keys \['PREFETCH'\] belong to removed"):
        nvfp4_gate_up(x, ids, w, config={**GU, "PREFETCH": True})
    # M > DECODE_MAX_TOKENS goes to the grouped path, which checks its own arguments
    big = torch.zeros(DECODE_MAX_TOKENS + 1, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^shared_output"):
        flint_moe(big, torch.zeros(E, H, dtype=torch.bfloat16), w, k, None, big[:, :32])
    with pytest.raises(ValueError, match="top_k"):
        flint_moe(x, torch.zeros(E, H, dtype=torch.bfloat16), w, E + 1, None, sh)
    with pytest.raises(TypeError, match="^router_weight"):
        flint_moe(x, torch.zeros(E, H), w, k, None, sh)


# ------------------------------------------------------------------------------------------------------
# Tensor-core path (MMA): under the interpreter the INTERPRETER-path shim of ``mma_rows`` (same pointers,
# tl.load, exact dequantised products, fp32 sums) exercises the indexing: row / chunk / K-part tiles, the
# swizzled scale pointers, the partial last step (whole chunks and a half chunk), the K-split sums.
# ------------------------------------------------------------------------------------------------------


def _run_mma(w, x, ids, tw, sh, gu, dn, taps=None):
    act = nvfp4_gate_up(x, ids, w, taps=taps, config=gu)
    return nvfp4_down(act, ids, tw, w, sh, taps=taps, config=dn)


def test_mma_path_matches_golden_with_tails():
    # H/2 = 80 = 64 + 16 bytes (a partial step of one chunk); I = 176 stored as 192: I/2 = 88 = 64 + 16 + 8 bytes
    # (a whole chunk and a half chunk, i.e. one block, in the last step)
    E, H, I, M, k = 4, 160, 176, 1, 2
    w = make_weights(E, H, I, seed=5, pad_to=64)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=5)
    taps = {}
    out = _run_mma(w, x, ids, tw, sh, GU_MMA, DN_MMA, taps)
    counts = _check_taps(w, x, ids, tw, sh, taps, out, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
    assert counts["acc_elements"] == M * k * (2 * I + H)
    assert same(_run_mma(w, x, ids, tw, sh, GU_MMA, DN_MMA), out)  # production build == tapped build
    # poisoned padding (intermediate columns 176..191 of w2 and their scale bytes) changes nothing
    assert same(_run_mma(_poison(w, 0x7F), x, ids, tw, sh, GU_MMA, DN_MMA), out)


def test_mma_variants_and_k_split():
    """S / num_warps change no bit of the MMA path; SK = 2 (K halves in different warps) is checked against
    the golden bound and gives the same bits with 2 or 4 warps; a shape whose K is not a multiple of 64 * SK
    falls back to SK = 1 (same bits as SK = 1)."""
    E, H, I, M, k = 3, 256, 256, 1, 1  # H/2 = I/2 = 128 bytes: two 64-byte steps, splittable in two parts
    w = make_weights(E, H, I, seed=6)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=6)
    ref = _run_mma(w, x, ids, tw, sh, GU_MMA, DN_MMA)
    gu, dn = {**GU_MMA, "S": 4, "BN": 16, "num_warps": 2}, {**DN_MMA, "S": 4, "BH": 32, "num_warps": 2}
    assert same(_run_mma(w, x, ids, tw, sh, gu, dn), ref)
    taps = {}
    gu2 = {**GU_MMA, "num_warps": 2, "SK": 2}
    dn2 = {**DN_MMA, "num_warps": 2, "SK": 2}
    out = _run_mma(w, x, ids, tw, sh, gu2, dn2, taps)
    _check_taps(w, x, ids, tw, sh, taps, out, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
    # the part sums are added in a fixed order (p0 + p1), whatever the warps per part
    gu4 = {**gu2, "num_warps": 4, "BN": 16}
    dn4 = {**dn2, "num_warps": 4, "BH": 32}
    assert same(_run_mma(w, x, ids, tw, sh, gu4, dn4), out)
    # load fence: GPU scheduling only (a no-op under the interpreter), same bits
    gu_f, dn_f = {**GU_MMA, "S": 2, "FENCE": True}, {**DN_MMA, "S": 4, "FENCE": True}
    assert same(_run_mma(w, x, ids, tw, sh, gu_f, dn_f), ref)


def test_mma_down_early_loads():
    """Down, tensor-core path: EARLY weight loads before the grid-dependency wait and a register cap change no
    bit (the same per-row MMA sequence and combine; y_acc, y and out); the counters are left at 0 (the
    production build after them: same bits)."""
    from flint_moe.kernels.nvfp4.down_combine import _counters

    E, H, I, M, k = 3, 96, 256, 1, 2  # 6 row blocks of 16; with BH 64: 2 blocks, rows 96..127 masked
    w = make_weights(E, H, I, seed=9)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=9)
    act = nvfp4_gate_up(x, ids, w, config=GU_MMA)
    taps0 = {}
    ref = nvfp4_down(act, ids, tw, w, sh, config=DN_MMA, taps=taps0)
    for over in (
        {"EARLY": 1},
        {"S": 4, "EARLY": 1, "MAXNREG": 72},
        {"EARLY": 1, "BH": 64, "num_warps": 4},
    ):
        taps = {}
        cfg = {**DN_MMA, **over}
        assert same(nvfp4_down(act, ids, tw, w, sh, config=cfg, taps=taps), ref), over
        assert same(taps["down_acc"], taps0["down_acc"]) and same(taps["y"], taps0["y"]), over
    assert same(nvfp4_down(act, ids, tw, w, sh, config=cfg), ref)  # production build, counters reused
    assert int(_counters(act.device, 1).abs().sum()) == 0


def test_mma_uneven_k_split():
    """K not a multiple of 64 SK: the first SK - 1 parts take ``mma_part_bytes`` (a multiple of 64) bytes, the last
    the rest; within the FP32_TRUNCATE bound, independent of the warps per part; a split whose last part would be
    empty runs with half the parts on half the warps (same bits as that configuration)."""
    from flint_moe.kernels.nvfp4.mma import mma_part_bytes

    assert [mma_part_bytes(k, sk) for k, sk in ((1024, 4), (1440, 2), (1440, 4), (80, 2), (96, 2), (352, 4))] == [
        256, 768, 384, 64, 64, 128,
    ]  # fmt: skip
    E, H, I, M, k = 3, 160, 192, 2, 2  # H/2 = 80 -> parts 64 + 16; I/2 = 96 -> parts 64 + 32
    w = make_weights(E, H, I, seed=7)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=7)
    gu2 = {**GU_MMA, "num_warps": 2, "SK": 2}
    dn2 = {**DN_MMA, "num_warps": 2, "SK": 2}
    taps = {}
    out = _run_mma(w, x, ids, tw, sh, gu2, dn2, taps)
    counts = _check_taps(w, x, ids, tw, sh, taps, out, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
    assert counts["acc_elements"] == M * k * (2 * I + H)
    # the part sums are added in a fixed order whatever the warps per part
    assert same(_run_mma(w, x, ids, tw, sh, {**gu2, "num_warps": 4, "BN": 16}, {**dn2, "num_warps": 4, "BH": 32}), out)
    # SK = 4 would leave the last part empty (3 x 64 >= 80, 96): runs as SK = 2 on 2 warps
    gu4, dn4 = {**GU_MMA, "num_warps": 4, "SK": 4}, {**DN_MMA, "num_warps": 4, "SK": 4}
    assert same(_run_mma(w, x, ids, tw, sh, gu4, dn4), out)


def test_fence_ptx():
    """The load fence folds every code and scale word of the call into the scale multiplier through the opaque
    zero operand, after the last load and before the first decode; the other asm bodies are unchanged by it."""
    from flint_moe.kernels.nvfp4.mma import mma_ptx

    plain, fenced = mma_ptx(2, 4, False).splitlines(), mma_ptx(2, 4, False, FENCE=True).splitlines()
    extra = [line for line in fenced if line not in plain]
    # 2 rows x 4 sub-steps: 32 code words + 8 scale words -> 39 xor, the and with the zero operand ($10: after
    # 2 outputs and 4 x 2 inputs), the or into the multiplier
    assert sum(line.startswith("xor.b32 fz") for line in extra) == 39
    assert "and.b32 fz, fz, $10;" in extra and "or.b32 k119, k119, fz;" in extra
    last_load = max(i for i, line in enumerate(fenced) if "ld.global.nc" in line and "[$6" not in line)  # codes, scales
    first_decode = min(i for i, line in enumerate(fenced) if line.startswith("prmt.b32 v,"))
    fence = fenced.index("or.b32 k119, k119, fz;")
    assert last_load < fence < first_decode
    assert [line for line in fenced if line not in extra] == plain


def test_early_wait_ptx():
    """EARLY 1: the grid-dependency wait runs under a predicate computed from every carried code / scale word and
    the opaque zero operand (always true), so the weight loads precede it."""
    from flint_moe.kernels.nvfp4.mma import early_wait_ptx

    lines = early_wait_ptx(20).splitlines()
    # 20 carried tensors x 2 registers ($2..$41), zero at $42
    assert lines[3] == "xor.b32 fz, $2, $3;" and sum(line.startswith("xor.b32 fz, fz, $") for line in lines) == 38
    i = lines.index("and.b32 fz, fz, $42;")
    assert lines[i + 1 : i + 3] == ["setp.ne.b32 pw, fz, 0;", "@!pw griddepcontrol.wait;"]


def test_accumulation_models():
    from flint_moe.kernels.nvfp4 import down_combine as nvfp4_down, gate_up as nvfp4_gate_up

    assert nvfp4_gate_up.accumulation_model({"MMA": True}) == FP32_TRUNCATE
    assert nvfp4_down.accumulation_model({"MMA": True}) == FP32_TRUNCATE
    assert nvfp4_gate_up.accumulation_model({"MMA": False}) == BLOCK16
    assert nvfp4_down.accumulation_model({"MMA": False}) == BLOCK16


def test_per_shape_defaults():
    """``default_config(H, I)``: the module default updated with ``nvfp4_tuned.*_BY_SHAPE[(H, I)]`` (a pure function
    of the shape, never another accumulation path), and every such shape in the sm_90 audit registry."""
    from flint_moe.kernels.audit.registry import AUDIT_REGISTRY
    from flint_moe.kernels.nvfp4 import down_combine as nvfp4_down, gate_up as nvfp4_gate_up, tuned as nvfp4_tuned
    from flint_moe.kernels.nvfp4.config import check_shape_overrides as _check_shape_overrides

    for mod, table, name in (
        (nvfp4_gate_up, nvfp4_tuned.GATE_UP_BY_SHAPE, "nvfp4_gate_up"),
        (nvfp4_down, nvfp4_tuned.DOWN_BY_SHAPE, "nvfp4_down"),
    ):
        base = mod.GATE_UP_CONFIG if mod is nvfp4_gate_up else mod.DOWN_CONFIG
        assert mod.default_config(7168, 2048) == base  # DeepSeek-V3: the tuned default itself
        for (h, i), over in table.items():
            cfg = mod.default_config(h, i)
            assert cfg == {**base, **over} and cfg["MMA"] == base["MMA"]
            assert mod.accumulation_model(cfg) == mod.accumulation_model(None)
            assert f"{name}.H{h}.I{i}" in AUDIT_REGISTRY
    with pytest.raises(ValueError, match="may not change MMA"):
        _check_shape_overrides({"MMA": True, "BN": 8}, {(64, 64): {"MMA": False}}, "t")
    with pytest.raises(ValueError, match="unknown config keys"):
        _check_shape_overrides({"MMA": True, "BN": 8}, {(64, 64): {"BX": 1}}, "t")
