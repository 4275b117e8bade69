"""The Nsight Compute summary reads ncu's raw CSV page: one row per launch, units row dropped, stall reasons
ranked (a hand-written page in ncu's format)."""

from benchmarks.tune.ncu_kernels import summarise

RAW = "\n".join([
    "==PROF== Connected to process 1",
    '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum.per_second",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_not_issued_per_issue_active.ratio","launch__grid_size"',
    '"","","ns","byte/s","inst","inst","inst",""',
    '"0","kernel_partial","35,200","1,650,000,000,000","3.25","0.75","9.0","16,384"',
    '"1","kernel_partial","12000","1e12","0.5","1.5","9.0","4"',
])  # fmt: skip


def test_summarise_one_row_per_launch_with_ranked_stalls():
    rows = summarise("ll:deepseek-v3:1", RAW)
    assert [r["us"] for r in rows] == [35.2, 12.0]
    assert rows[0]["dram_tbps"] == 1.65 and rows[0]["grid"] == 16384.0
    assert list(rows[0]["stalls"].items()) == [("long_scoreboard", 3.25), ("wait", 0.75)]
    assert list(rows[1]["stalls"]) == ["wait", "long_scoreboard"]
    assert rows[0]["regs"] != rows[0]["regs"]  # a metric the page lacks reads NaN


def test_kernel_expression_per_bench():
    """A point's bench picks the kernels ncu profiles: its own expression, the grouped path's for ``ab-<variant>``,
    and a KeyError naming the benches for an unknown one (not silently the grouped kernels)."""
    import pytest

    from benchmarks.tune.ncu_kernels import KERNELS, _kernels

    assert _kernels("gluon:deepseek-v3:128") == KERNELS["gluon"] == "_gluon_gate_up|_gluon_down"
    assert _kernels("ab-gluon+tail:deepseek-v3:128") == KERNELS["grouped"]
    with pytest.raises(KeyError, match="bench must be one of .* or ab-<variant>"):
        _kernels("glun:deepseek-v3:128")


def test_grouped_points_resolve_their_ab_variant(monkeypatch):
    """The grouped benches profile the ``--ab`` variant they name, an open BM resolved as ``--ab`` resolves it (the
    default's BM for the layer, capped at 128: 16 at DeepSeek-V3 M = 128, 128 at M = 4096), an explicit BM kept."""
    from benchmarks import bench_grouped_nvfp4
    from benchmarks.tune.ncu_kernels import _fn

    monkeypatch.setattr(bench_grouped_nvfp4, "prepare", lambda model, M, config: type("P", (), {"fn": config}))
    gluon = {"ENGINE": "gluon"}
    assert _fn("grouped:deepseek-v3:128") is None and _fn("ab-default:deepseek-v3:128") is None
    assert _fn("triton:deepseek-v3:4096") == {"gate_up": {"ENGINE": "triton"}, "down": {"ENGINE": "triton"}}
    assert _fn("gluon:deepseek-v3:128") == {"TAIL": 0, "BM": 16, "gate_up": gluon, "down": gluon}
    assert _fn("gluontail:deepseek-v3:4096") == {"TAIL": 32, "BM": 128, "gate_up": gluon, "down": gluon}
    assert _fn("ab-gluon-bm64+32:deepseek-v3:4096") == {"TAIL": 32, "BM": 64, "gate_up": gluon, "down": gluon}
