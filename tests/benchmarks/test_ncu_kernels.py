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
