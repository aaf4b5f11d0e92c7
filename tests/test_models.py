"""Model shapes, checked against numbers derived by hand from each config and vLLM's sharding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from warmd.errors import WarmdInputError
from warmd.examples import resolve_model_path
from warmd.models import model_shapes
from warmd.models.quantization import parse_quantization


def shapes(model: str, tp: int = 1, ep: int = 1, quantization: str | None = None) -> dict:
    result = model_shapes(resolve_model_path(model), tp, ep, quantization)
    return {layer.name: layer for layer in result.layers if layer.op in ("linear", "moe")}


def nk(layer) -> tuple:
    return (layer.num_groups, layer.n, layer.k) if layer.num_groups else (layer.n, layer.k)


@pytest.mark.parametrize("tp, expected", [
    # qkv: (heads/tp + 2 * kv_heads/tp) * 128; o: K = heads/tp * 128; gate_up: 2 * 14336 / tp
    (1, {"self_attn.qkv_proj": (6144, 4096), "self_attn.o_proj": (4096, 4096),
         "mlp.gate_up_proj": (28672, 4096), "mlp.down_proj": (4096, 14336),
         "lm_head": (128256, 4096)}),
    (2, {"self_attn.qkv_proj": (3072, 4096), "self_attn.o_proj": (4096, 2048),
         "mlp.gate_up_proj": (14336, 4096), "mlp.down_proj": (4096, 7168),
         "lm_head": (64128, 4096)}),
    # TP=16 > 8 KV heads: each rank keeps one replicated KV head.
    (16, {"self_attn.qkv_proj": (512, 4096), "self_attn.o_proj": (4096, 256),
          "mlp.gate_up_proj": (1792, 4096), "mlp.down_proj": (4096, 896)}),
])
def test_llama_dense_shapes(tp, expected):
    got = shapes("llama-3.1-8b", tp)
    for name, value in expected.items():
        assert nk(got[name]) == value, name
    assert got["self_attn.qkv_proj"].count == 32
    assert got["self_attn.qkv_proj"].quant == "bf16"


@pytest.mark.parametrize("tp, ep, expected", [
    (1, 1, {"self_attn.qkv_proj": (5120, 2048), "self_attn.o_proj": (2048, 4096),
            "mlp.experts.w13": (128, 1536, 2048), "mlp.experts.w2": (128, 2048, 768),
            "mlp.gate": (128, 2048)}),
    (2, 1, {"self_attn.qkv_proj": (2560, 2048), "self_attn.o_proj": (2048, 2048),
            "mlp.experts.w13": (128, 768, 2048), "mlp.experts.w2": (128, 2048, 384)}),
    # Expert parallel: experts split across ranks, intermediate size whole.
    (1, 4, {"mlp.experts.w13": (32, 1536, 2048), "mlp.experts.w2": (32, 2048, 768)}),
    (4, 4, {"self_attn.qkv_proj": (1280, 2048),
            "mlp.experts.w13": (32, 1536, 2048), "mlp.experts.w2": (32, 2048, 768)}),
    # SGLang-style EP smaller than TP: experts split 2 ways, intermediate 768 / (4/2) = 384.
    (4, 2, {"mlp.experts.w13": (64, 768, 2048), "mlp.experts.w2": (64, 2048, 384)}),
])
def test_qwen3_moe_shapes(tp, ep, expected):
    got = shapes("qwen3-30b-a3b-fp8", tp, ep)
    for name, value in expected.items():
        assert nk(got[name]) == value, name
    assert got["mlp.experts.w13"].count == 48
    assert got["mlp.experts.w13"].topk == 8
    assert got["mlp.experts.w13"].quant == "fp8_block"
    assert got["mlp.gate"].quant == "bf16"  # listed in modules_to_not_convert


def test_qwen3_moe_mlp_only_layers(write_config):
    config = {"model_type": "qwen3_moe", "hidden_size": 1024, "intermediate_size": 4096,
              "moe_intermediate_size": 512, "num_experts": 16, "num_experts_per_tok": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
              "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5],
              "vocab_size": 1000}
    got = {layer.name: layer for layer in model_shapes(write_config(config)).layers}
    # sparse step 2: layers 1, 3, 5 are MoE, but 5 is forced dense -> 2 MoE, 4 dense.
    assert got["mlp.experts.w13"].count == 2
    assert got["mlp.gate_up_proj"].count == 4
    assert nk(got["mlp.gate_up_proj"]) == (8192, 1024)


@pytest.mark.parametrize("tp, ep, expected", [
    (8, 1, {"self_attn.fused_qkv_a_proj": (2112, 7168), "self_attn.q_b_proj": (3072, 1536),
            "self_attn.kv_b_proj": (4096, 512), "self_attn.o_proj": (7168, 2048),
            "mlp.gate_up_proj": (4608, 7168), "mlp.down_proj": (7168, 2304),
            "mlp.gate": (256, 7168),
            "mlp.experts.w13": (256, 512, 7168), "mlp.experts.w2": (256, 7168, 256),
            "mlp.shared_experts.gate_up_proj": (512, 7168),
            "mlp.shared_experts.down_proj": (7168, 256), "lm_head": (16160, 7168)}),
    (8, 8, {"mlp.experts.w13": (32, 4096, 7168), "mlp.experts.w2": (32, 7168, 2048),
            "mlp.shared_experts.gate_up_proj": (512, 7168)}),
    (16, 1, {"self_attn.q_b_proj": (1536, 1536), "self_attn.kv_b_proj": (2048, 512),
             "self_attn.o_proj": (7168, 1024), "mlp.gate_up_proj": (2304, 7168),
             "mlp.down_proj": (7168, 1152), "mlp.experts.w13": (256, 256, 7168),
             "mlp.experts.w2": (256, 7168, 128)}),
])
def test_deepseek_v3_shapes(tp, ep, expected):
    got = shapes("deepseek-v3", tp, ep)
    for name, value in expected.items():
        assert nk(got[name]) == value, name
    assert got["mlp.gate_up_proj"].count == 3  # first_k_dense_replace
    assert got["mlp.experts.w13"].count == 58
    assert got["self_attn.fused_qkv_a_proj"].count == 61


def test_deepseek_mla_attention_params():
    result = model_shapes(resolve_model_path("deepseek-v3"), tp=8)
    attn = next(layer for layer in result.layers if layer.op == "attention")
    assert attn.param == {"kind": "mla", "num_heads": 16, "kv_lora_rank": 512,
                          "qk_rope_head_dim": 64}


def test_mixtral_shapes():
    got = shapes("mixtral-8x7b", tp=2)
    assert nk(got["mlp.experts.w13"]) == (8, 14336, 4096)
    assert nk(got["mlp.experts.w2"]) == (8, 4096, 7168)
    assert got["mlp.experts.w13"].topk == 2 and got["mlp.experts.w13"].quant == "bf16"
    got = shapes("mixtral-8x7b", tp=1, ep=8)
    assert nk(got["mlp.experts.w13"]) == (1, 28672, 4096)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "mistral"])
def test_other_dense_types(write_config, model_type):
    config = {"model_type": model_type, "hidden_size": 2560, "intermediate_size": 9728,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 36, "vocab_size": 151936}
    got = {layer.name: layer for layer in model_shapes(write_config(config), tp=2).layers}
    # head_dim given explicitly (qwen3 style): (16 + 2*4) * 128
    assert nk(got["self_attn.qkv_proj"]) == (3072, 2560)
    assert nk(got["self_attn.o_proj"]) == (2560, 2048)
    assert nk(got["mlp.gate_up_proj"]) == (9728, 2560)


def test_quantization_parsing():
    block = parse_quantization({"quantization_config": {"quant_method": "fp8",
                                                        "weight_block_size": [128, 128]}})
    assert (block.scheme, block.block) == ("fp8_block", (128, 128))
    assert parse_quantization({"quantization_config": {"quant_method": "fp8"}}).scheme \
        == "fp8_tensor"
    assert parse_quantization({"quantization_config": {"quant_method": "mxfp8"}}).scheme \
        == "mxfp8"
    modelopt = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "MXFP8"}}
    assert parse_quantization(modelopt).scheme == "mxfp8"
    modelopt_fp8 = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}
    assert parse_quantization(modelopt_fp8).scheme == "fp8_tensor"
    assert parse_quantization({}).scheme == "bf16"
    assert parse_quantization({}, "fp8_block").block == (128, 128)
    with pytest.raises(WarmdInputError, match="unsupported quantization"):
        parse_quantization({"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(WarmdInputError, match="unknown quantization"):
        parse_quantization({}, "int3")


def test_ignored_layers_stay_bf16(write_config):
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                      "ignored_layers": ["self_attn.o_proj"]}}
    got = {layer.name: layer for layer in model_shapes(write_config(config)).layers}
    assert got["self_attn.o_proj"].quant == "bf16"
    assert got["self_attn.qkv_proj"].quant == "fp8_block"


def test_fp8_block_partition_must_be_whole_blocks():
    # 768 / 4 = 192 per rank is not a multiple of the 128 weight block: vLLM refuses to load.
    with pytest.raises(WarmdInputError, match="192 per rank, not a multiple of the FP8"):
        model_shapes(resolve_model_path("qwen3-30b-a3b-fp8"), tp=4)
    # The same sharding of a BF16 checkpoint is fine.
    model_shapes(resolve_model_path("qwen3-30b-a3b-fp8"), tp=4, quantization="bf16")


@pytest.mark.parametrize("tp, ep, message", [
    (3, 1, "--tp=3 does not divide num_attention_heads"),
    (1, 3, "--ep=3 does not divide the number of routed experts"),
    (0, 1, "must be positive"),
])
def test_bad_parallelism(tp, ep, message):
    with pytest.raises(WarmdInputError, match=message):
        model_shapes(resolve_model_path("qwen3-30b-a3b-fp8"), tp, ep)


def test_ep_must_divide_tp_when_smaller(write_config):
    config = {"model_type": "qwen3_moe", "hidden_size": 3072, "moe_intermediate_size": 1536,
              "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 24,
              "num_key_value_heads": 6, "head_dim": 128, "num_hidden_layers": 2}
    with pytest.raises(WarmdInputError, match="--ep=4 must divide --tp=6"):
        model_shapes(write_config(config), tp=6, ep=4)
    got = {layer.name: layer for layer in model_shapes(write_config(config), tp=6, ep=2).layers}
    # 16 experts / 2 EP ranks; intermediate split by TP/EP = 3 ranks: 1536 / 3 = 512.
    assert nk(got["mlp.experts.w13"]) == (8, 1024, 3072)
    assert nk(got["mlp.experts.w2"]) == (8, 3072, 512)


def test_kv_heads_not_dividing(write_config):
    config = {"model_type": "llama", "hidden_size": 1536, "intermediate_size": 4096,
              "num_attention_heads": 12, "num_key_value_heads": 3, "num_hidden_layers": 2}
    with pytest.raises(WarmdInputError, match="num_key_value_heads"):
        model_shapes(write_config(config), tp=2)


def test_bad_configs(tmp_path, write_config):
    with pytest.raises(WarmdInputError, match="not found"):
        model_shapes(tmp_path / "missing")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(WarmdInputError, match="not valid JSON"):
        model_shapes(broken)
    with pytest.raises(WarmdInputError, match="supported: llama, mistral, qwen2, qwen3"):
        model_shapes(write_config({"model_type": "gpt2"}))
    with pytest.raises(WarmdInputError, match="hidden_size"):
        model_shapes(write_config({"model_type": "llama", "hidden_size": "big"}))


def _example(name: str) -> dict:
    return json.loads((Path(resolve_model_path(name)) / "config.json").read_text())


# (example, field, value, message): values vLLM/SGLang would refuse when building the model.
BAD_VALUES = [
    ("llama-3.1-8b", "head_dim", "x", "'head_dim' must be a positive integer, got 'x'"),
    ("llama-3.1-8b", "num_key_value_heads", 0, "'num_key_value_heads' must be a positive"),
    ("llama-3.1-8b", "num_key_value_heads", 5, "not a multiple of num_key_value_heads (5)"),
    ("llama-3.1-8b", "vocab_size", "many", "'vocab_size' must be an integer >= 0"),
    ("llama-3.1-8b", "hidden_act", 3, "'hidden_act' must be a name"),
    ("llama-3.1-8b", "num_hidden_layers", True, "'num_hidden_layers' must be a positive"),
    ("llama-3.1-8b", "architectures", "LlamaForCausalLM", "'architectures' must be a list"),
    ("deepseek-v3", "first_k_dense_replace", "three", "'first_k_dense_replace' must be an"),
    ("deepseek-v3", "moe_layer_freq", 0, "'moe_layer_freq' must be a positive integer"),
    ("deepseek-v3", "n_shared_experts", -1, "'n_shared_experts' must be an integer >= 0"),
    ("deepseek-v3", "q_lora_rank", "1536", "'q_lora_rank' must be an integer >= 0"),
    ("deepseek-v3", "quantization_config", {"quant_method": "fp8",
                                            "weight_block_size": [128, "x"]},
     "weight_block_size must be two positive integers"),
    ("qwen3-30b-a3b-fp8", "decoder_sparse_step", "1", "'decoder_sparse_step' must be a"),
    ("qwen3-30b-a3b-fp8", "mlp_only_layers", "0,1", "'mlp_only_layers' must be a list"),
    ("qwen3-30b-a3b-fp8", "quantization_config", {"quant_method": "fp8",
                                                  "weight_block_size": [128, 128],
                                                  "ignored_layers": "lm_head"},
     "ignored_layers must be a list of layer names"),
]


@pytest.mark.parametrize("example, field, value, message", BAD_VALUES,
                         ids=[f"{c[1]}={c[2]!r}" for c in BAD_VALUES])
def test_every_value_an_engine_would_refuse_is_bad_input(write_config, example, field, value,
                                                         message):
    directory = write_config({**_example(example), field: value})
    with pytest.raises(WarmdInputError, match=re.escape(message)):
        model_shapes(directory, tp=1)


@pytest.mark.parametrize("example, field, value", [
    ("llama-3.1-8b", "head_dim", "x"), ("deepseek-v3", "first_k_dense_replace", "three")])
def test_bad_config_value_is_one_line_exit_2(write_config, tmp_path, example, field, value):
    directory = write_config({**_example(example), field: value})
    result = subprocess.run([sys.executable, "-m", "warmd", "plan", "--model", str(directory),
                             "--target", "h200"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and field in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
