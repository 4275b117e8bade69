"""``flint_moe.checkpoints.gguf.read_gguf_layer`` on malformed files: every error a ``CheckpointError`` naming the
file (and the tensor or key where there is one): truncated files (cut in the magic, the counts, the metadata, the
tensor-info table, the data), garbled magic / version / array length / tensor type, overlapping tensor data,
non-canonical or unbounded expert indices, an expert count that disagrees with ``<arch>.expert_count``, a
router that is not finite. Files are written with gguf-py's writer and edited with its own reader
(tests/checkpoints/_writers.py); expected offsets come from gguf-py's reader of the intact file."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import gguf  # the test extra installs it: a missing gguf fails here, it is not skipped
import pytest

from flint_moe.checkpoints import CheckpointError, read_gguf_layer
from tests.checkpoints._writers import (
    NOT_CANONICAL,
    layer0_rejection,
    layer_fixture,
    patch_gguf,
    write_gguf_modelopt,
    write_gguf_nvfp4,
)

E, H, I, K = 4, 64, 64, 2  # noqa: E741  (multiples of 64: the NVFP4 block)
EX = "model.layers.0.mlp.experts."


layer = layer_fixture(E, H, I, seed=11)
_message = layer0_rejection(read_gguf_layer)


@pytest.fixture(scope="module")
def intact(tmp_path_factory, layer) -> tuple[Path, bytes, object]:
    """A convention-(a) file with an array in its metadata, its bytes and gguf-py's reader of it."""
    p = write_gguf_modelopt(tmp_path_factory.mktemp("gguf") / "a.gguf", {0: layer}, top_k=K,
                            edit_writer=lambda w: w.add_array("test.values", [1, 2, 3]))  # fmt: skip
    assert read_gguf_layer(p, 0).num_experts == E
    return p, p.read_bytes(), gguf.GGUFReader(str(p))


def _copy(tmp_path: Path, data: bytes, name: str) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("where", ["magic", "counts", "metadata", "tensor info"])
def test_truncated_header(tmp_path: Path, intact, where: str) -> None:
    _, data, r = intact
    info = [t.field.offset for t in r.tensors]  # where each tensor's info record starts
    n = {"magic": 2, "counts": 10, "metadata": info[0] - 3, "tensor info": info[5] + 7}[where]
    p = _copy(tmp_path, data[:n], "cut.gguf")
    msg = _message(p)
    m = re.fullmatch(rf"{re.escape(str(p))}: truncated or garbled: reading bytes \[(\d+), (\d+)\) but the file ends "
                     rf"at byte {n}", msg)  # fmt: skip
    assert m and int(m[1]) <= n < int(m[2]), msg


@pytest.mark.parametrize("at", ["first", "middle", "last"])
def test_truncated_data(tmp_path: Path, intact, at: str) -> None:
    # the first tensor (in file order) whose data runs past the cut is named
    _, data, r = intact
    end = max(t.data_offset + t.n_bytes for t in r.tensors)
    n = {"first": r.data_offset + 1, "middle": (r.data_offset + end) // 2, "last": end - 1}[at]
    t = next(t for t in r.tensors if t.data_offset + t.n_bytes > n)
    p = _copy(tmp_path, data[:n], "cut.gguf")
    with pytest.raises(CheckpointError) as exc:
        read_gguf_layer(p, 0)
    assert (exc.value.path, exc.value.tensor) == (str(p), t.name)
    assert str(exc.value) == (
        f"{t.name} in {p}: data bytes [{t.data_offset}, {t.data_offset + t.n_bytes}) run past the end of the "
        f"file ({n} bytes): truncated or garbled"
    )


def test_empty_file(tmp_path: Path) -> None:
    p = _copy(tmp_path, b"", "empty.gguf")
    assert _message(p).startswith(f"{p}: not a readable GGUF file: ")


def test_garbled_magic_and_version(tmp_path: Path, intact) -> None:
    _, data, _ = intact
    p = _copy(tmp_path, b"GGUX" + data[4:], "magic.gguf")
    assert _message(p) == f"{p}: not a readable GGUF file: ValueError: GGUF magic invalid"
    p = _copy(tmp_path, data[:4] + struct.pack("<I", 99) + data[8:], "version.gguf")
    assert re.fullmatch(rf"{re.escape(str(p))}: not a readable GGUF file: ValueError: .*version 99.*", _message(p))


def test_garbled_array_length(tmp_path: Path, intact) -> None:
    # far beyond the file: gguf-py alone slices past its end (a numpy error without the file's name or, where the
    # elements line up with the end, empty elements for 2**40 iterations)
    _, data, _ = intact
    p = _copy(tmp_path, data, "array.gguf")
    patch_gguf(p, lambda r: r.fields["test.values"].parts[4].__setitem__(0, 2**40))
    assert re.fullmatch(rf"{re.escape(str(p))}: truncated or garbled: reading bytes \[\d+, \d+\) but the file ends at "
                        rf"byte {len(data)}", _message(p))  # fmt: skip


def test_unknown_tensor_type(tmp_path: Path, intact) -> None:
    _, data, _ = intact
    p = _copy(tmp_path, data, "type.gguf")
    patch_gguf(p, lambda r: _info(r, EX + "1.up_proj.weight")[4].__setitem__(0, 200))
    assert _message(p) == f"{EX}1.up_proj.weight in {p}: unknown GGML tensor type 200"


def _info(reader, name: str) -> list:
    """A tensor's info record parts (name length, name, n_dims, dims, type, offset) as writable views."""
    return next(t for t in reader.tensors if t.name == name).field.parts


@pytest.mark.parametrize("how", ["same start", "inside"])
def test_overlapping_tensor_data(tmp_path: Path, intact, how: str) -> None:
    _, data, r = intact
    t = {x.name: x for x in r.tensors}
    gate = t[EX + "1.gate_proj.weight"]
    s, n = gate.data_offset, gate.n_bytes
    # up's data made to start where gate's does (same shape: it would load as a copy of gate), or a global scale
    # pointing 8 bytes into gate's data
    other, start = (
        (t[EX + "1.up_proj.weight"], s) if how == "same start" else (t[EX + "2.down_proj.weight_scale_2"], s + 8)
    )
    p = _copy(tmp_path, data, "overlap.gguf")
    patch_gguf(p, lambda w: _info(w, other.name)[5].__setitem__(0, start - r.data_offset))
    assert _message(p) == (
        f"{other.name} in {p}: data bytes [{start}, {start + other.n_bytes}) overlap those of {gate.name} "
        f"[{s}, {s + n})"
    )


def test_noncanonical_expert_index(tmp_path: Path, layer) -> None:
    # expert 3's down weight absent, expert 0's spelt '00': refused, never a stand-in
    named, router = layer
    bad = {n: t for n, t in named.items() if n != "3.down_proj.weight"}
    bad["00.down_proj.weight"] = named["0.down_proj.weight"]
    p = write_gguf_modelopt(tmp_path / "00.gguf", {0: (bad, router)}, top_k=K)
    assert _message(p) == f"{EX}00.down_proj.weight in {p}: expert index '00' {NOT_CANONICAL}"


def test_unbounded_expert_index(tmp_path: Path, layer) -> None:
    # an index far beyond the experts present: refused from the name, before any allocation
    named, router = layer
    big = {**named, "99999999999.gate_proj.weight": named["0.gate_proj.weight"]}
    p = write_gguf_modelopt(tmp_path / "big.gguf", {0: (big, router)}, top_k=K)
    assert (
        _message(p)
        == f"{EX}99999999999.gate_proj.weight in {p}: expert index '99999999999' out of range (at most 9 digits)"
    )
    far = {**named, "999999.gate_proj.weight": named["0.gate_proj.weight"]}
    p = write_gguf_modelopt(tmp_path / "far.gguf", {0: (far, router)}, top_k=K)
    assert (
        _message(p)
        == f"{EX}4.* in {p}: expert 4 has no tensors (expert 999999 has: the indices present must be 0..E-1)"
    )


def test_expert_count_metadata(tmp_path: Path, layer) -> None:
    # <arch>.expert_count bounds the indices and asks for every expert
    p = write_gguf_modelopt(tmp_path / "c6.gguf", {0: layer}, top_k=K, edit_writer=lambda w: w.add_expert_count(6))
    assert _message(p) == f"{EX}4.* in {p}: expert 4 has no tensors (the file's expert_count = 6: experts 0..5)"
    p = write_gguf_modelopt(tmp_path / "c3.gguf", {0: layer}, top_k=K, edit_writer=lambda w: w.add_expert_count(3))
    assert _message(p) == f"{EX}3.down_proj.weight in {p}: expert index 3 out of range [0, 3)"
    p = write_gguf_modelopt(tmp_path / "c4.gguf", {0: layer}, top_k=K, edit_writer=lambda w: w.add_expert_count(4))
    assert read_gguf_layer(p, 0).num_experts == E
    p = write_gguf_nvfp4(tmp_path / "b5.gguf", {0: layer}, top_k=K, edit_writer=lambda w: w.add_expert_count(5))
    assert _message(p) == f"blk.0.ffn_gate_exps.weight in {p}: 4 experts, but the file's expert_count is 5"


def test_layer_index_is_canonical(tmp_path: Path, layer) -> None:
    p = write_gguf_modelopt(tmp_path / "l01.gguf", {"01": layer}, top_k=K)  # 'model.layers.01.' is not layer 1
    with pytest.raises(CheckpointError) as exc:
        read_gguf_layer(p, 1)
    assert str(exc.value) == (
        f"{p}: layer 1: neither blk.1.ffn_gate_exps.weight nor model.layers.1.mlp.experts.<e>.* "
        "(MoE layers present: [])"
    )


def test_router_must_be_finite(tmp_path: Path, layer) -> None:
    named, router = layer
    r = router.clone()
    r[2, 5] = float("inf")
    p = write_gguf_modelopt(tmp_path / "a.gguf", {0: (named, r)}, top_k=K)  # BF16 router
    assert _message(p) == (
        f"model.layers.0.mlp.gate.weight in {p}: non-finite value inf at index (2, 5) (router logits must be finite)"
    )
    r = router.clone()
    r[1, 2] = float("nan")
    p = write_gguf_nvfp4(tmp_path / "b.gguf", {0: (named, r)}, top_k=K)  # F32 router
    assert (
        _message(p)
        == f"blk.0.ffn_gate_inp.weight in {p}: non-finite value nan at index (1, 2) (router logits must be finite)"
    )
