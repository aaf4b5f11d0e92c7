"""Hostile model and config input through the real CLI (`python -m warmd` in a process of its
own): a config.json or warmd.yaml nested 10^5 deep, counts far beyond any real model, alias
bombs, oversized files: one line on stderr, exit 2, no traceback. And counts within the
bounds are planned without iterating over layers (the same shapes, counted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warmd.config.load import MAX_CONFIG_FILE_BYTES, MAX_YAML_NODES
from warmd.examples import resolve_model_path
from warmd.models import model_shapes
from warmd.models.config_json import FIELD_BOUNDS, MAX_CONFIG_BYTES

DEEP = 100_000


def _warmd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], capture_output=True,
                          text=True, timeout=120, env={
                              **os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"),
                              "WARMD_REDIS_URL": "off"})


def _refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines[0]) < 400
    for word in words:
        assert word in lines[0], lines[0]


def _model(tmp_path: Path, base: str = "qwen3-30b-a3b-fp8", **fields) -> Path:
    config = json.loads((Path(resolve_model_path(base)) / "config.json").read_text())
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return directory


def _plan(tmp_path: Path, model: Path) -> subprocess.CompletedProcess:
    return _warmd(tmp_path, "plan", "-m", str(model), "-t", "h200", "--engine", "vllm",
                  "--json")


def test_a_config_json_nested_1e5_deep_is_one_line_exit_2(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * DEEP
                                       + "]" * DEEP + "}")
    _refused(_plan(tmp_path, model), "nests deeper than")


def test_a_warmd_yaml_nested_1e5_deep_is_one_line_exit_2(tmp_path):
    for name, text in {"flow.yaml": "models: " + "[" * DEEP + "]" * DEEP + "\n",
                       "map.yaml": "models: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n"}.items():
        path = tmp_path / name
        path.write_text(text)
        _refused(_warmd(tmp_path, "warmup", "--from-config", str(path)), "nests deeper than")


def test_an_alias_bomb_in_warmd_yaml_is_refused(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append("models: [{path: x}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    _refused(_warmd(tmp_path, "warmup", "--from-config", str(path)), str(MAX_YAML_NODES))


def test_oversized_files_are_refused_unread(tmp_path):
    yaml_path = tmp_path / "big.yaml"
    yaml_path.write_text("models: [{path: x}]\n" + "#" * MAX_CONFIG_FILE_BYTES + "\n")
    _refused(_warmd(tmp_path, "warmup", "--from-config", str(yaml_path)), "larger than")
    model = _model(tmp_path, padding="x" * MAX_CONFIG_BYTES)
    _refused(_plan(tmp_path, model), "over the")


@pytest.mark.parametrize("field, value", [
    ("num_hidden_layers", 10**11),
    ("num_experts", 10**9),
    ("num_attention_heads", 2**40),
    ("vocab_size", 10**12),
    ("moe_intermediate_size", 10**15),
])
def test_counts_beyond_any_real_model_are_one_line_exit_2(tmp_path, field, value):
    _refused(_plan(tmp_path, _model(tmp_path, **{field: value})), field, "bound")


def test_a_1e11_layer_config_is_refused_before_planning(tmp_path):
    """The issue's config: 10^11 layers, sparse every second layer (hours of planning and
    hundreds of MB before, one line now)."""
    model = _model(tmp_path, num_hidden_layers=10**11, decoder_sparse_step=2)
    _refused(_plan(tmp_path, model), "num_hidden_layers", str(FIELD_BOUNDS["num_hidden_layers"]))


@pytest.mark.parametrize("base, fields, dense, sparse", [
    # Qwen3-MoE: layer i sparse when (i + 1) % step == 0 and not MLP-only
    ("qwen3-30b-a3b-fp8", {"num_hidden_layers": 1024, "decoder_sparse_step": 3,
                           "mlp_only_layers": [2, 5, 6, 4000]}, 1024 - (341 - 2), 341 - 2),
    # DeepSeek-V3: layers from first_k_dense_replace on, every moe_layer_freq-th, are MoE
    ("deepseek-v3", {"num_hidden_layers": 1000, "first_k_dense_replace": 7,
                     "moe_layer_freq": 4}, 1000 - 248, 248),
])
def test_layer_counts_at_the_bound_are_counted_not_listed(tmp_path, base, fields, dense,
                                                          sparse):
    shapes = model_shapes(_model(tmp_path, base, **fields))
    by_name = {layer.name: layer.count for layer in shapes.layers}
    assert shapes.num_hidden_layers == fields["num_hidden_layers"]
    assert by_name["mlp.experts.w13"] == sparse
    assert by_name["mlp.down_proj"] == dense
