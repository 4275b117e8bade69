"""The Gluon grouped GEMMs (config ``ENGINE`` 'gluon' and the warp-specialised 'gluon_ws') on the H200 (marked
gpu): bitwise the Triton kernels.

Real layers (DeepSeek-V3, Qwen3-235B-A22B, gpt-oss-120b) at bandwidth-bound and tensor-core-bound token counts,
row blocks of 16 / 32 / 64 / 128 pairs: the op's production output and every tap of the tapped build (gate_acc,
up_acc, act, down_acc, y, out) equal the default Triton kernels' bit for bit; the golden model fed the taps
(order-free steps bitwise, accumulators within the certified bound); CUDA-graph replays bitwise identical.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.grouped_gluon_ws import ws_stage_bytes
from flint_moe.ops import flint_moe_grouped, make_route_counter

from ._grouped_check import check_grouped_taps
from ._nvfp4_check import capture_graph, run_op_checked, same
from .test_nvfp4_grouped_gpu import _tokens, _weights

pytestmark = pytest.mark.gpu


def _engine(engine: str, stages: int | None = None) -> dict:
    kernel = {"ENGINE": engine} if stages is None else {"ENGINE": engine, "num_stages": stages}
    return {"gate_up": kernel, "down": dict(kernel)}


def _gluon_op(w, x, router, k, counter, shared, bm, taps=None, out=None, tail=0, engine="gluon"):
    cfg = {**_engine(engine), "BM": bm, "TAIL": tail}
    return flint_moe_grouped(x, router, w, k, counter, shared, taps=taps, config=cfg, out=out)


@pytest.mark.parametrize("engine", ["gluon", "gluon_ws"])
@pytest.mark.parametrize(
    "E,H,I,k,M,bm,tail",
    [
        (256, 7168, 2048, 8, 128, 16, 0),
        (256, 7168, 2048, 8, 4096, 128, 0),
        (256, 7168, 2048, 8, 4096, 128, 32),
        (256, 7168, 2048, 8, 4096, 128, 64),
        (256, 7168, 2048, 8, 256, 16, 16),
        (256, 7168, 2048, 8, 1024, 32, 0),
        (128, 4096, 1536, 8, 2000, 128, 32),
        (128, 2880, 2880, 4, 4096, 128, 32),
        (128, 2880, 2880, 4, 600, 64, 0),
        # K steps of 128 not a multiple of the warp-specialised loop body (2 steps): 9 (gate/up) and 3 (down) take
        # bodies then one step alone; 5 (two bodies and one step) and 2 (one body, nothing left)
        (64, 1152, 384, 4, 600, 128, 32),
        (32, 640, 256, 2, 300, 128, 32),
        # a K loop shorter than the Gluon ring (down: 2 K steps of 128 on 4 slots at BM 16): no copy past w2's end
        (256, 1024, 256, 8, 200, 16, 0),
    ],
)
def test_gluon_equals_triton_every_tap(E, H, I, k, M, bm, tail, engine):  # noqa: E741, N803
    """A Gluon engine (with the same row-block schedule, tails included) against the Triton kernels: every tap
    bitwise, the production build too, at every ring depth. gpt-oss-120b (K 2880) is refused by 'gluon_ws' (K steps
    of 128), naming the constraint."""
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, 23)
    counter = make_route_counter("cuda")
    if engine == "gluon_ws" and (H % 128 or I % 128):
        with pytest.raises(ValueError, match="ENGINE 'gluon_ws' needs a reduction length that is a multiple of 128"):
            _gluon_op(w, x, router, k, counter, shared, bm, tail=tail, engine=engine)
        return
    t0: dict = {}
    t1: dict = {}
    triton = {**_engine("triton"), "TAIL": tail, "BM": bm}  # the reference: the Triton kernels, same schedule
    o0 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t0, config=triton)
    o1 = _gluon_op(w, x, router, k, counter, shared, bm, taps=t1, tail=tail, engine=engine)
    assert same(o1, o0)
    for name in ("gate_acc", "up_acc", "act", "down_acc", "y", "out"):
        assert same(t1[name], t0[name]), f"{engine} BM {bm} TAIL {tail}: {name} differs from the Triton kernels"
    del t0, t1
    assert same(_gluon_op(w, x, router, k, counter, shared, bm, tail=tail, engine=engine), o0)  # production build
    for stages in (2, 3):  # the ring depth changes no bit
        cfg = {**_engine(engine, stages), "BM": bm, "TAIL": tail}
        if engine == "gluon_ws" and stages * ws_stage_bytes(bm, tail)[0] + ws_stage_bytes(bm, tail)[1] > 224 << 10:
            with pytest.raises(ValueError, match=f"num_stages = {stages} needs 2 .. 2 ring slots"):  # BM 128 + 64
                flint_moe_grouped(x, router, w, k, counter, shared, config=cfg)
            continue
        assert same(flint_moe_grouped(x, router, w, k, counter, shared, config=cfg), o0)
    if engine == "gluon_ws":  # one program per tile instead of one per SM: the same bits
        kernel = {"ENGINE": engine, "PERSISTENT": False}
        cfg = {"BM": bm, "TAIL": tail, "gate_up": kernel, "down": dict(kernel)}
        assert same(flint_moe_grouped(x, router, w, k, counter, shared, config=cfg), o0)


def test_gluon_refusals_on_the_gpu():
    """On the H200 the launch checks name the row-block and reduction-length constraints, and the default engine
    follows them."""
    from flint_moe.kernels.nvfp4.grouped_gluon import check_gluon_launch
    from flint_moe.kernels.nvfp4.permute import moe_permute

    ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32, device="cuda")
    check_gluon_launch("op", moe_permute(ids, 4, 16, 16), 192)  # a tail is served; three K steps of 64
    with pytest.raises(ValueError, match="at least two K steps of 128 \\(a reduction length >= 256\\), got 128"):
        check_gluon_launch("op", moe_permute(ids, 4, 16), 128)
    with pytest.raises(ValueError, match="BM <= 128"):
        check_gluon_launch("op", moe_permute(ids, 4, 256), 128)
    with pytest.raises(ValueError, match="multiple of 64, got 96"):
        check_gluon_launch("op", moe_permute(ids, 4, 16), 96)
    from flint_moe.kernels.nvfp4.grouped_gluon_ws import check_ws_launch

    check_ws_launch("op", moe_permute(ids, 4, 128, 64), 256)
    from flint_moe.kernels.nvfp4.grouped_gate_up import default_engine

    # the engine a launch takes by default: warp-specialised at BM 128 with a tail and K a multiple of 128, the
    # Gluon kernels at BM 16, else the Triton kernels
    assert default_engine(moe_permute(ids, 4, 128, 32), 7168) == "gluon_ws"
    assert default_engine(moe_permute(ids, 4, 128, 32), 2880) == "triton"
    assert default_engine(moe_permute(ids, 4, 128), 7168) == "triton"
    assert default_engine(moe_permute(ids, 4, 16, 16), 2880) == "gluon"
    assert default_engine(moe_permute(ids, 4, 16), 7168) == "gluon"
    assert default_engine(moe_permute(ids, 4, 64, 32), 7168) == "triton"
    assert default_engine(moe_permute(ids, 4, 256, 32), 7168) == "triton"
    with pytest.raises(ValueError, match="ENGINE 'gluon_ws' needs a tail of at most 64 pairs, got 128"):
        check_ws_launch("op", moe_permute(ids, 4, 128, 128), 256)
    with pytest.raises(ValueError, match="multiple of 128, got 192"):
        check_ws_launch("op", moe_permute(ids, 4, 16), 192)


@pytest.mark.parametrize("engine", ["gluon", "gluon_ws"])
def test_gluon_golden_and_graph_replay(engine):
    """DeepSeek-V3 M = 1024: the golden model fed a Gluon engine's taps; CUDA-graph replays bitwise identical."""
    E, H, I, k, M = 256, 7168, 2048, 8, 1024  # noqa: E741
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, 29)
    counter = make_route_counter("cuda")

    def op(x, router, weights, k, counter, shared, taps=None):
        cfg = {**_engine(engine), "BM": 32, "TAIL": 0}
        return flint_moe_grouped(x, router, weights, k, counter, shared, taps=taps, config=cfg)

    run_op_checked(op, check_grouped_taps, w, x, router, k, counter, shared, acc_pairs=[(0, 0), (M - 1, 7), (517, 3)])
    ref = _gluon_op(w, x, router, k, counter, shared, 32, engine=engine)
    graph, out = capture_graph(lambda: _gluon_op(w, x, router, k, counter, shared, 32, engine=engine))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert same(out, ref)
