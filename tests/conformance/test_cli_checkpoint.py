"""``python -m flint_moe.conformance --checkpoint PATH --layer N``: the matrix's NVFP4 token counts on one MoE
layer of a checkpoint (decode path up to ``ops.decode_max_tokens(E, k)``, grouped above), run through the harness."""

from __future__ import annotations

import json

import pytest

from flint_moe.conformance.__main__ import checkpoint_selection, main
from flint_moe.conformance.inputs.cases import matrix
from flint_moe.ops import decode_max_tokens
from tests.checkpoints._writers import write_modelopt_dir
from tests.checkpoints.test_conformance_checkpoint import K, _experts


def test_selection_covers_the_matrix_token_counts_and_picks_the_path_by_m(tmp_path) -> None:
    named, router, _ = _experts(3)
    d = write_modelopt_dir(tmp_path / "ck", {1: (named, router)}, top_k=K, shards=1)
    cases, inputs = checkpoint_selection(str(d), 1, "cpu", [], "cpu")
    want = sorted({c.M for c in matrix("cpu") if c.path.startswith("nvfp4_")})
    limit = decode_max_tokens(6, K)  # E = 6, k = 3: 6 // 3 = 2
    assert limit == 2 and [c.M for c in cases] == want and min(want) <= limit < max(want)
    for c in cases:
        assert c.path == ("nvfp4_decode" if c.M <= limit else "nvfp4_grouped")
        assert c.shape == "ckpt-ck-L1" and c.id in inputs and inputs[c.id].x.shape[0] == c.M
    only = checkpoint_selection(str(d), 1, "cpu", ["/M2/"], "cpu")[0]
    assert [c.id for c in only] == ["nvfp4_decode/ckpt-ck-L1/M2/modelopt/s0"]


def test_cli_runs_a_checkpoint_layer(tmp_path) -> None:
    named, router, _ = _experts(4)
    d = write_modelopt_dir(tmp_path / "ck", {0: (named, router)}, top_k=K, shards=1)
    out = tmp_path / "rep"
    args = ["--profile", "cpu", "--checkpoint", str(d), "--layer", "0", "--filter", "/M2/", "--out", str(out)]
    rc = main([*args, "--no-html", "--no-mutation", "--no-invariance"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert [c["case_id"] for c in rep["cases"]] == ["nvfp4_decode/ckpt-ck-L0/M2/modelopt/s0"]
    assert rep["cases"][0]["verdict"] != "FAIL"
    meta = rep["cases"][0]["meta"]  # checkpoint inputs are given: no "inputs" phase
    assert set(meta["phase_seconds"]) == {"run", "compare"} and meta["seconds"] + 0.002 >= sum(
        meta["phase_seconds"].values()
    )  # 3-decimal rounding
    assert rep["env"]["checkpoint"] == f"{d} layer 0"
    assert main(["--profile", "cpu", "--checkpoint", str(d)]) == 2  # --layer missing


def _bad_checkpoint(tmp_path, kind: str):
    """(path, expected stderr line or None) for a checkpoint the loaders refuse."""
    import gguf
    import torch

    from tests.checkpoints._writers import random_experts, write_gguf_modelopt

    named, router = random_experts(2, 64, 64)
    if kind.startswith("gguf"):
        p = write_gguf_modelopt(tmp_path / "a.gguf", {0: (named, router)}, top_k=1)
        data = p.read_bytes()
        if kind == "gguf-header":
            p.write_bytes(data[:10])
            return p, None
        if kind == "gguf-dtype":
            wrong = {**named, "1.up_proj.weight_scale": torch.tensor(1.0)}  # written as F32: a TypeError inside
            p = write_gguf_modelopt(tmp_path / "b.gguf", {0: (wrong, router)}, top_k=1)
            return p, None
        t = gguf.GGUFReader(str(p)).tensors[3]
        n = t.data_offset + 1
        p.write_bytes(data[:n])
        return p, (
            f"--checkpoint {p} --layer 0: {t.name} in {p}: data bytes [{t.data_offset}, {t.data_offset + t.n_bytes}) "
            f"run past the end of the file ({n} bytes): truncated or garbled"
        )
    d = write_modelopt_dir(tmp_path / "ck", {0: (named, router)}, top_k=1, shards=1)
    if kind == "json-list":
        (d / "config.json").write_text("[]")
        return d, f"--checkpoint {d} --layer 0: {d / 'config.json'}: expected a JSON object at the top level, got list"
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:64])
    return d, None


@pytest.mark.parametrize("kind", ["gguf-header", "gguf-data", "gguf-dtype", "json-list", "safetensors"])
def test_cli_refuses_a_bad_checkpoint_in_one_line(tmp_path, capsys, kind: str) -> None:
    path, want = _bad_checkpoint(tmp_path, kind)
    assert main(["--profile", "cpu", "--checkpoint", str(path), "--layer", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"--checkpoint {path} --layer 0: "), err
    assert str(path) in err[0][len(f"--checkpoint {path} --layer 0: ") :], err  # the loader's message names the file
    if want is not None:
        assert err == [want]
