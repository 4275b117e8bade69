"""``flint_moe.checkpoints.modelopt.read_modelopt_layer`` on malformed directories: every error a
``CheckpointError`` naming the file and the tensor or key. Index entries that leave the directory (absolute,
``..``, a symlink out; a Hugging Face hub snapshot's blob links are inside), JSON that is not an object or not
JSON, repeated index keys, non-canonical / unbounded expert indices, the config's expert count, an unreadable
shard, a wrongly typed tensor, a router that is not finite. Written with safetensors' own writer
(tests/checkpoints/_writers.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from flint_moe.checkpoints import read_layer, read_modelopt_layer
from tests.checkpoints._writers import (
    NOT_CANONICAL,
    layer0_rejection,
    layer_fixture,
    write_modelopt_dir,
)

E, H, I, K = 4, 32, 32, 2  # noqa: E741
EX = "model.layers.0.mlp.experts."
ROUTER = "model.layers.0.mlp.gate.weight"


layer = layer_fixture(E, H, I, seed=12)
_message = layer0_rejection(read_modelopt_layer)


def _index(d: Path) -> tuple[Path, dict]:
    f = d / "model.safetensors.index.json"
    return f, json.loads(f.read_text())


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
def test_index_entry_outside_the_directory(tmp_path: Path, layer, how: str) -> None:
    d = write_modelopt_dir(tmp_path / "ck", {0: layer}, top_k=K, shards=2)
    idx, doc = _index(d)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(d / doc["weight_map"][ROUTER], outside)  # a readable copy: it would load
    os.symlink(outside, d / "link.safetensors")
    entry, why = {
        "dot-dot": ("../outside.safetensors", f"file '../outside.safetensors' is not a path inside the checkpoint "
                    f"directory {d}"),
        "absolute": (str(outside), f"file {str(outside)!r} is not a path inside the checkpoint directory {d}"),
        "symlink": ("link.safetensors", f"file 'link.safetensors' resolves to {outside.resolve()}, outside the "
                    "checkpoint directory"),
    }[how]  # fmt: skip
    idx.write_text(json.dumps({**doc, "weight_map": {**doc["weight_map"], ROUTER: entry}}))
    assert _message(d) == f"{ROUTER} in {idx}: {why}"


def test_unindexed_shard_symlinked_outside(tmp_path: Path, layer) -> None:
    u = write_modelopt_dir(tmp_path / "one", {0: layer}, top_k=K, shards=1)
    shutil.move(u / "model.safetensors", tmp_path / "moved.safetensors")
    os.symlink(tmp_path / "moved.safetensors", u / "model.safetensors")
    assert _message(u) == (
        f"{u}: file 'model.safetensors' resolves to {(tmp_path / 'moved.safetensors').resolve()}, outside the "
        "checkpoint directory"
    )


def test_hub_snapshot_links_into_its_blobs(tmp_path: Path, layer) -> None:
    # a Hugging Face hub cache snapshot: its files are links into the repository's blobs folder
    repo = tmp_path / "hub" / "models--org--name"
    snap = write_modelopt_dir(repo / "snapshots" / "abc123", {0: layer}, top_k=K, shards=2)
    (repo / "blobs").mkdir()
    for f in list(snap.iterdir()):
        shutil.move(f, repo / "blobs" / f"sha-{f.name}")
        os.symlink(f"../../blobs/sha-{f.name}", f)
    want = read_modelopt_layer(write_modelopt_dir(tmp_path / "plain", {0: layer}, top_k=K, shards=1), 0)
    assert read_modelopt_layer(snap, 0).experts.equal(want.experts)


@pytest.mark.parametrize(
    "file, text, why",
    [
        ("hf_quant_config.json", "[1, 2]", "{f}: expected a JSON object at the top level, got list"),
        (
            "hf_quant_config.json",
            '{"quantization": ["NVFP4"]}',
            "quantization in {f}: expected a JSON object, got list",
        ),
        ("config.json", "[]", "{f}: expected a JSON object at the top level, got list"),
        ("config.json", '{"text_config": 3}', "text_config in {f}: expected a JSON object, got int"),
        ("config.json", '{"num_experts": "4"}', "num_experts in {f}: expected a positive integer, got '4'"),
        ("model.safetensors.index.json", "[]", "{f}: expected a JSON object at the top level, got list"),
        (
            "model.safetensors.index.json",
            "weight_map = {}",
            "{f}: not valid JSON: Expecting value: line 1 column 1 (char 0)",
        ),  # fmt: skip
    ],
)
def test_json_files(tmp_path: Path, layer, file: str, text: str, why: str) -> None:
    d = write_modelopt_dir(tmp_path / "ck", {0: layer}, top_k=K, shards=2)
    (d / file).write_text(text)
    assert _message(d) == why.format(f=d / file)


def test_index_weight_map_entries(tmp_path: Path, layer) -> None:
    d = write_modelopt_dir(tmp_path / "ck", {0: layer}, top_k=K, shards=2)
    idx, doc = _index(d)
    name = EX + "0.gate_proj.weight"
    text = json.dumps(doc)  # the same key written twice (json.loads alone keeps the second silently)
    idx.write_text(text.replace('"weight_map": {', f'"weight_map": {{"{name}": "x.safetensors", ', 1))
    assert _message(d) == f"{idx}: not valid JSON: key {name!r} appears twice in one object"
    idx.write_text(json.dumps({**doc, "weight_map": {**doc["weight_map"], name: 5}}))
    assert _message(d) == f"{name} in {idx}: expected a file name, got 5"
    idx.write_text(json.dumps({**doc, "weight_map": {**doc["weight_map"], name: "nope.safetensors"}}))
    assert _message(d) == f"{name} in {d / 'nope.safetensors'}: no such safetensors file"


def test_noncanonical_expert_index(tmp_path: Path, layer) -> None:
    named, router = layer
    bad = {n: t for n, t in named.items() if n != "3.down_proj.weight"}
    bad["00.down_proj.weight"] = named["0.down_proj.weight"]  # expert 0's slot spelt otherwise: no stand-in for 3
    d = write_modelopt_dir(tmp_path / "00", {0: (bad, router)}, top_k=K, shards=1)
    assert _message(d) == f"{EX}00.down_proj.weight in {d / 'model.safetensors'}: expert index '00' {NOT_CANONICAL}"


def test_unbounded_expert_index(tmp_path: Path, layer) -> None:
    named, router = layer
    big = {**named, "99999999999.gate_proj.weight": named["0.gate_proj.weight"]}
    d = write_modelopt_dir(tmp_path / "big", {0: (big, router)}, top_k=K, shards=1)
    assert _message(d) == (
        f"{EX}99999999999.gate_proj.weight in {d / 'model.safetensors'}: expert index '99999999999' out of range "
        "(at most 9 digits)"
    )


def test_config_expert_count(tmp_path: Path, layer) -> None:
    d = write_modelopt_dir(tmp_path / "cfg", {0: layer}, top_k=K, shards=1)
    cfg = d / "config.json"
    cfg.write_text(json.dumps({"num_experts_per_tok": K, "num_experts": 6}))
    assert _message(d) == f"{EX}4.* in {d}: expert 4 has no tensors (config.json num_experts = 6: experts 0..5)"
    cfg.write_text(json.dumps({"text_config": {"n_routed_experts": 3}}))
    assert _message(d) == f"{EX}3.down_proj.weight in {d / 'model.safetensors'}: expert index 3 out of range [0, 3)"
    cfg.write_text(json.dumps({"num_experts_per_tok": K, "num_local_experts": 4}))
    assert read_modelopt_layer(d, 0).num_experts == E
    with pytest.raises(ValueError, match=r"^layer: must be an int >= 0, got -1$"):
        read_layer(d, -1)


def test_unreadable_shard(tmp_path: Path, layer) -> None:
    d = write_modelopt_dir(tmp_path / "cut", {0: layer}, top_k=K, shards=1)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    assert _message(d).startswith(f"{f}: not a readable safetensors file: ")  # found by scanning: no tensor yet
    d = write_modelopt_dir(tmp_path / "cut2", {0: layer}, top_k=K, shards=2)
    _, doc = _index(d)
    name = EX + "0.gate_proj.weight"
    f = d / doc["weight_map"][name]
    f.write_bytes(f.read_bytes()[:100])
    assert _message(d).startswith(f"{name} in {f}: not a readable safetensors file: ")


def test_wrong_dtype(tmp_path: Path, layer) -> None:
    named, router = layer
    wrong = {**named, "1.up_proj.weight": torch.zeros(I, H // 2).half()}
    d = write_modelopt_dir(tmp_path / "f16", {0: (wrong, router)}, top_k=K, shards=1)
    assert _message(d).startswith(f"{EX}1.up_proj.weight in {d / 'model.safetensors'}: dtype must be torch.uint8")


def test_router_must_be_finite(tmp_path: Path, layer) -> None:
    named, router = layer
    r = router.clone()
    r[1, 2] = float("nan")
    d = write_modelopt_dir(tmp_path / "nan", {0: (named, r)}, top_k=K, shards=1)
    assert _message(d) == (
        f"{ROUTER} in {d / 'model.safetensors'}: non-finite value nan at index (1, 2) (router logits must be finite)"
    )
