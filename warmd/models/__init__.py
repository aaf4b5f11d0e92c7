"""Model shapes from a local Hugging Face config.json, sharded exactly as vLLM shards them.

Column-parallel layers divide N by TP, row-parallel layers divide K; merged projections
(qkv, gate_up) are one GEMM; MoE experts split across EP ranks (vLLM runs the experts with
TP=1 under expert parallelism) or their intermediate size across TP ranks. The config.json
is read and its fields checked by warmd.models.config_json, its quantization by
warmd.models.quantization.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from warmd.errors import WarmdInputError
from warmd.models.config_json import int_list, load_config, optional, require, text_field
from warmd.models.quantization import Quantization, parse_quantization

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MOE_TYPES = ("qwen3_moe", "mixtral")
MLA_TYPES = ("deepseek_v3", "deepseek_v2")
SUPPORTED_MODEL_TYPES = DENSE_TYPES + MOE_TYPES + MLA_TYPES
# Engines pick the model class by `architectures`, not `model_type` (vLLM:
# vllm/model_executor/models/registry.py; SGLang: python/sglang/srt/models/registry.py), so a
# derivative with its own model_type (Kimi-K2: "kimi_k2" on DeepseekV3ForCausalLM) loads as
# its architecture. Each architecture maps to the warmd builder of the same layers.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2",
}


@dataclass(frozen=True)
class Layer:
    """One distinct layer shape of the model on one rank, with how many times it occurs."""

    name: str
    op: str  # linear | moe | attention | activation | sampling
    quant: str
    n: int | None = None
    k: int | None = None
    num_groups: int | None = None
    count: int = 1
    block: tuple[int, int] | None = None
    topk: int | None = None
    params: tuple[tuple[str, object], ...] = field(default=())

    @property
    def param(self) -> dict:
        return dict(self.params)

    def shape_key(self) -> tuple:
        return (self.name, self.op, self.quant, self.n, self.k, self.num_groups, self.block,
                self.topk, self.params)

    def describe_shape(self) -> str:
        if self.op in ("linear", "moe"):
            groups = f"{self.num_groups}x" if self.num_groups else ""
            return f"{groups}N={self.n} K={self.k}" + (f" top{self.topk}" if self.topk else "")
        return " ".join(f"{k}={v}" for k, v in self.params)


@dataclass(frozen=True)
class ModelShapes:
    model_type: str
    path: str
    tp: int
    ep: int
    quant: Quantization
    layers: tuple[Layer, ...]
    num_hidden_layers: int
    config_digest: str = ""  # sha256 of the config.json's content: the model's identity
    dp: int = 1


def _divide(total: int, parts: int, what: str, flag: str) -> int:
    if total % parts:
        raise WarmdInputError(f"{flag}={parts} does not divide {what} ({total})")
    return total // parts


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    # vLLM replicates KV heads when TP exceeds them.
    if kv_heads >= tp:
        return _divide(kv_heads, tp, "num_key_value_heads", "--tp")
    if tp % kv_heads:
        raise WarmdInputError(f"--tp={tp} is neither a divisor nor a multiple of "
                              f"num_key_value_heads ({kv_heads})")
    return 1


class _Builder:
    """Collects per-decoder-layer shapes, then deduplicates them with counts."""

    def __init__(self, quant: Quantization, moe_ranks: int, refine_moe_block=None):
        self.quant = quant
        self.moe_ranks = moe_ranks  # ranks one MoE layer spans (its TP or EP group)
        # The engine's FP8 MoE block refinement, (block, per rank, hidden, moe TP) -> the
        # refined block or None (vLLM's; warmd.engines.rules); None: the engine refuses.
        self.refine_moe_block = refine_moe_block
        self.counts: Counter = Counter()
        self.order: dict[tuple, Layer] = {}

    def add(self, layer: Layer, times: int = 1) -> None:
        key = layer.shape_key()
        self.order.setdefault(key, layer)
        self.counts[key] += times

    def linear(self, name: str, n: int, k: int, times: int = 1, quantized: bool = True) -> None:
        q = self.quant.for_layer(name) if quantized else Quantization("bf16")
        self.add(Layer(name, "linear", q.scheme, n, k, block=q.block), times)

    def moe(self, name: str, groups: int, n: int, k: int, topk: int, times: int,
            params: tuple = (), block: tuple[int, int] | None = None) -> None:
        q = self.quant.for_layer(name)
        if q.scheme == "fp8_tensor" and q.static_activations:
            params = (*params, ("act_scales", "static"))
        self.add(Layer(name, "moe", q.scheme, n, k, groups, block=block or q.block, topk=topk,
                       params=params), times)

    def layers(self) -> tuple[Layer, ...]:
        return tuple(
            Layer(**{**layer.__dict__, "count": self.counts[key]})
            for key, layer in self.order.items()
        )


def _attention_mha(b: _Builder, config: dict, tp: int, times: int) -> None:
    hidden, heads = require(config, "hidden_size", "num_attention_heads")
    kv_heads = optional(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise WarmdInputError(f"model config: num_attention_heads ({heads}) is not a multiple "
                              f"of num_key_value_heads ({kv_heads})")
    head_dim = optional(config, "head_dim", hidden // heads)
    q_per_rank = _divide(heads, tp, "num_attention_heads", "--tp")
    kv_per_rank = _kv_heads_per_rank(kv_heads, tp)
    b.linear("self_attn.qkv_proj", (q_per_rank + 2 * kv_per_rank) * head_dim, hidden, times)
    b.linear("self_attn.o_proj", hidden, q_per_rank * head_dim, times)
    b.add(Layer("self_attn.attn", "attention", "bf16", params=(
        ("kind", "mha"), ("num_qo_heads", q_per_rank), ("num_kv_heads", kv_per_rank),
        ("head_dim", head_dim))), times)


def _attention_mla(b: _Builder, config: dict, tp: int, times: int) -> None:
    hidden, heads, kv_lora, nope, rope, v_dim = require(
        config, "hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
        "qk_rope_head_dim", "v_head_dim")
    q_lora = optional(config, "q_lora_rank", 0, minimum=0)
    heads_per_rank = _divide(heads, tp, "num_attention_heads", "--tp")
    if q_lora:
        # q_a and kv_a are merged and replicated on every rank (disable_tp in vLLM).
        b.linear("self_attn.fused_qkv_a_proj", q_lora + kv_lora + rope, hidden, times)
        b.linear("self_attn.q_b_proj", heads_per_rank * (nope + rope), q_lora, times)
    else:
        b.linear("self_attn.q_proj", heads_per_rank * (nope + rope), hidden, times)
        b.linear("self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden, times)
    b.linear("self_attn.kv_b_proj", heads_per_rank * (nope + v_dim), kv_lora, times)
    b.linear("self_attn.o_proj", hidden, heads_per_rank * v_dim, times)
    b.add(Layer("self_attn.attn", "attention", "bf16", params=(
        ("kind", "mla"), ("num_heads", heads_per_rank), ("kv_lora_rank", kv_lora),
        ("qk_rope_head_dim", rope))), times)


def _check_fp8_blocks(b: _Builder, name: str, per_rank: int, what: str, flag: str) -> None:
    """vLLM and SGLang refuse to load FP8 block-quantized weights whose sharded partition is not
    a whole number of weight blocks; say so at plan time instead."""
    q = b.quant.for_layer(name)
    if q.scheme == "fp8_block" and q.block and per_rank % q.block[0]:
        raise WarmdInputError(
            f"{flag} leaves {what} = {per_rank} per rank, not a multiple of the FP8 weight "
            f"block ({q.block[0]}): the engine refuses to load this checkpoint so sharded")


def _dense_mlp(b: _Builder, name: str, hidden: int, inter: int, tp: int, times: int) -> None:
    per_rank = _divide(inter, tp, f"{name} intermediate size", "--tp")
    if tp > 1:
        _check_fp8_blocks(b, f"{name}.gate_up_proj", per_rank, f"{name} intermediate size",
                          f"--tp={tp}")
    b.linear(f"{name}.gate_up_proj", 2 * per_rank, hidden, times)
    b.linear(f"{name}.down_proj", hidden, per_rank, times)


def moe_tp_size(tp: int, ep: int) -> int:
    """How many ranks split each expert's intermediate size: TP/EP (SGLang's moe_tp_size);
    1 when EP spans every TP rank or more (vLLM's expert parallel, EP = TP x DP)."""
    if ep >= tp:
        return 1
    if tp % ep:
        raise WarmdInputError(f"--ep={ep} must divide --tp={tp} (or be a multiple of it)")
    return tp // ep


def _moe(b: _Builder, hidden: int, experts: int, inter: int, topk: int, tp: int, ep: int,
         times: int) -> None:
    b.linear("mlp.gate", experts, hidden, times, quantized=False)
    groups = _divide(experts, ep, "the number of routed experts", "--ep")
    moe_tp = moe_tp_size(b.moe_ranks, ep)
    per_rank = _divide(inter, moe_tp, "moe_intermediate_size", f"--tp/--ep={moe_tp}")
    q = b.quant.for_layer("mlp.experts.w13")
    refined = b.refine_moe_block(q.block, per_rank, hidden, moe_tp) if \
        moe_tp > 1 and b.refine_moe_block and q.scheme == "fp8_block" and q.block else None
    if moe_tp > 1 and refined is None:
        _check_fp8_blocks(b, "mlp.experts.w13", per_rank, "moe_intermediate_size",
                          f"--tp={tp} --ep={ep}" + (f" ({moe_tp} MoE ranks)"
                                                     if moe_tp != tp else ""))
    # One kernel serves both GEMMs of the experts: selection sees the whole layer's sizes.
    params = (("hidden", hidden), ("intermediate", per_rank), ("ep", ep))
    if refined:
        params = (*params, ("refined_from", f"{q.block[0]}x{q.block[1]}"))
    b.moe("mlp.experts.w13", groups, 2 * per_rank, hidden, topk, times, params, refined)
    b.moe("mlp.experts.w2", groups, hidden, per_rank, topk, times, params, refined)


def _activation_and_sampling(b: _Builder, config: dict, vocab_tp: int, hidden: int,
                             times: int) -> None:
    act = text_field(config, "hidden_act", "") or text_field(config, "hidden_activation",
                                                                "silu")
    b.add(Layer("mlp.act_fn", "activation", "bf16", params=(("act", act),)), times)
    vocab = optional(config, "vocab_size", 0, minimum=0)
    if vocab > 0:
        padded = -(-vocab // 64) * 64  # vLLM pads the vocabulary to a multiple of 64
        b.linear("lm_head", _divide(padded, vocab_tp, "padded vocab_size", "--tp"), hidden,
                 quantized=False)
        b.add(Layer("sampler", "sampling", "bf16", params=(("vocab_size", vocab),)))


def _build_dense(b: _Builder, config: dict, tp: int, ep: int) -> int:
    hidden, inter, n_layers = require(config, "hidden_size", "intermediate_size",
                                       "num_hidden_layers")
    _attention_mha(b, config, tp, n_layers)
    _dense_mlp(b, "mlp", hidden, inter, tp, n_layers)
    _activation_and_sampling(b, config, tp, hidden, n_layers)
    return n_layers


def _build_moe(b: _Builder, config: dict, tp: int, ep: int) -> int:
    hidden, n_layers = require(config, "hidden_size", "num_hidden_layers")
    if config.get("model_type") == "mixtral":
        experts, inter, topk = require(config, "num_local_experts", "intermediate_size",
                                        "num_experts_per_tok")
        dense_layers = 0
    else:
        experts, inter, topk = require(config, "num_experts", "moe_intermediate_size",
                                        "num_experts_per_tok")
        step = optional(config, "decoder_sparse_step", 1)
        mlp_only = set(int_list(config, "mlp_only_layers"))
        # Layer i is sparse when (i + 1) % step == 0 and i is not MLP-only (vLLM's
        # Qwen*MoeDecoderLayer): counted, not listed, so planning time is no number's.
        sparse_mlp_only = sum(1 for i in mlp_only if i < n_layers and (i + 1) % step == 0)
        dense_layers = n_layers - (n_layers // step - sparse_mlp_only)
    _attention_mha(b, config, tp, n_layers)
    if dense_layers:
        _dense_mlp(b, "mlp", hidden, require(config, "intermediate_size")[0], tp,
                   dense_layers)
    _moe(b, hidden, experts, inter, topk, tp, ep, n_layers - dense_layers)
    _activation_and_sampling(b, config, tp, hidden, n_layers)
    return n_layers


def _build_mla(b: _Builder, config: dict, tp: int, ep: int) -> int:
    hidden, n_layers, inter, moe_inter, experts, topk = require(
        config, "hidden_size", "num_hidden_layers", "intermediate_size", "moe_intermediate_size",
        "n_routed_experts", "num_experts_per_tok")
    first_dense = min(optional(config, "first_k_dense_replace", 0, minimum=0), n_layers)
    freq = optional(config, "moe_layer_freq", 1)
    # the layers i in [first_dense, n_layers) with i % freq == 0, counted
    moe_layers = max(0, (n_layers - 1) // freq - (first_dense - 1) // freq)
    dense_layers = n_layers - moe_layers
    shared = optional(config, "n_shared_experts", 0, minimum=0)
    _attention_mla(b, config, tp, n_layers)
    if dense_layers:
        _dense_mlp(b, "mlp", hidden, inter, tp, dense_layers)
    if moe_layers:
        _moe(b, hidden, experts, moe_inter, topk, tp, ep, moe_layers)
        if shared:
            _dense_mlp(b, "mlp.shared_experts", hidden, moe_inter * shared, tp, moe_layers)
    _activation_and_sampling(b, config, tp, hidden, n_layers)
    return n_layers


_BUILDERS = {
    **{t: _build_dense for t in DENSE_TYPES},
    **{t: _build_moe for t in MOE_TYPES},
    **{t: _build_mla for t in MLA_TYPES},
}


def language_config(config: dict) -> dict:
    """The language model's config: multimodal checkpoints nest it under text_config (engines
    build the decoder from hf_config.get_text_config()); the quantization and architectures
    of the checkpoint stay at the top level."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    merged = dict(text)
    for key in ("quantization_config", "architectures"):
        if key in config and key not in merged:
            merged[key] = config[key]
    return merged


def resolve_model_type(config: dict, where: object) -> str:
    """model_type when warmd knows it, else the first known entry of `architectures`."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list):
        raise WarmdInputError(f"model config field 'architectures' must be a list of class "
                              f"names, got {architectures!r} in {where}")
    if isinstance(model_type, str) and model_type in _BUILDERS:
        return model_type
    for arch in architectures:
        if not isinstance(arch, str):
            continue
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise WarmdInputError(
        f"unsupported model_type {model_type!r} (architectures "
        f"{config.get('architectures')!r}) in {where}; supported: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)} or architectures {', '.join(ARCHITECTURES)}")


def model_shapes(path: str | Path, tp: int = 1, ep: int = 1,
                 quantization: str | None = None, dp: int = 1,
                 moe_ranks: int | None = None, refine_moe_block=None) -> ModelShapes:
    """Every layer of the model on one rank, deduplicated by shape with a count. moe_ranks is
    how many ranks one MoE layer spans (vLLM: TP x DP; default TP); refine_moe_block is the
    engine's FP8 MoE block refinement for a shard the checkpoint's blocks do not fit (None:
    the engine refuses such a checkpoint)."""
    if tp < 1 or ep < 1 or dp < 1:
        raise WarmdInputError("--tp, --dp and --ep must be positive integers")
    raw, config_path = load_config(path)
    config = language_config(raw)
    model_type = resolve_model_type(config, config_path)
    config = {**config, "model_type": model_type}
    quant = parse_quantization(config, quantization)
    builder = _Builder(quant, moe_ranks or tp, refine_moe_block)
    n_layers = _BUILDERS[model_type](builder, config, tp, ep)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return ModelShapes(model_type, str(config_path), tp, ep, quant, builder.layers(), n_layers,
                       config_digest=digest, dp=dp)
