"""A checkpoint's quantization (quantization_config, or the operator's override) as the
engines read it: the scheme, its weight blocks, the layers it leaves unquantized."""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmd.errors import WarmdInputError

QUANT_SCHEMES = ("fp8_block", "fp8_tensor", "mxfp8", "bf16")


@dataclass(frozen=True)
class Quantization:
    scheme: str
    block: tuple[int, int] | None = None
    ignored: tuple[str, ...] = ()
    # FP8 per-tensor weights with static per-tensor activation scales (kFp8StaticTensorSym
    # for both): what FlashInfer's fused MoE takes besides block FP8.
    static_activations: bool = False

    def for_layer(self, name: str) -> Quantization:
        """BF16 for layers a checkpoint leaves unquantized (ignored_layers and the like)."""
        if self.scheme == "bf16":
            return self
        for pattern in self.ignored:
            if pattern.startswith("re:"):  # compressed-tensors regex entries
                if re.fullmatch(pattern[3:], name) or re.fullmatch(pattern[3:], f"x.{name}"):
                    return Quantization("bf16")
                continue
            if name == pattern or name.endswith("." + pattern) or pattern.endswith("." + name):
                return Quantization("bf16")
        return self



def parse_quantization(config: dict, override: str | None = None) -> Quantization:
    if override is not None:
        scheme = override.lower().replace("-", "_")
        if scheme not in QUANT_SCHEMES:
            raise WarmdInputError(
                f"unknown quantization {override!r}; known: {', '.join(QUANT_SCHEMES)}")
        return Quantization(scheme, (128, 128) if scheme == "fp8_block" else None)
    qc = config.get("quantization_config")
    if not qc:
        return Quantization("bf16")
    if not isinstance(qc, dict):
        raise WarmdInputError("quantization_config must be a JSON object")
    method = str(qc.get("quant_method", "")).lower()
    algo = str(qc.get("quant_algo", "") or (qc.get("quantization") or {}).get("quant_algo", ""))
    ignored = _ignored(qc, "ignored_layers", "modules_to_not_convert", "exclude_modules")
    if method == "fp8":
        block = qc.get("weight_block_size")
        scheme = qc.get("activation_scheme", "dynamic")
        # Fp8Config.__init__: ACTIVATION_SCHEMES, and block weights only with dynamic ones.
        if scheme not in ("static", "dynamic"):
            raise WarmdInputError(f"quantization_config activation_scheme must be static or "
                                  f"dynamic, got {scheme!r}")
        if block and scheme != "dynamic":
            raise WarmdInputError("quantization_config: block-wise FP8 (weight_block_size) "
                                  "takes only the dynamic activation_scheme, as vLLM requires")
        if block:
            return Quantization("fp8_block", _block("weight_block_size", block), ignored)
        # Fp8Config.activation_scheme: "static" scales come with the checkpoint.
        return Quantization("fp8_tensor", None, ignored,
                            static_activations=qc.get("activation_scheme") == "static")
    if method == "mxfp8" or algo.upper() == "MXFP8":
        return Quantization("mxfp8", (1, 32), ignored)
    if method == "modelopt" and algo.upper() == "FP8":
        # ModelOpt FP8: per-tensor weights and static per-tensor input scales.
        return Quantization("fp8_tensor", None, ignored, static_activations=True)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fbgemm_fp8":
        # Per-channel FP8 weights, dynamic per-token activations: vLLM's FBGEMMFp8Config runs
        # them through the scaled-mm kernels (vllm/model_executor/layers/quantization/
        # fbgemm_fp8.py), like per-tensor FP8.
        return Quantization("fp8_tensor", None, ignored)
    raise WarmdInputError(
        f"unsupported quantization (quant_method={method or None!r}, quant_algo={algo or None!r});"
        " supported: fp8 (block or per-tensor), compressed-tensors FP8, fbgemm_fp8, mxfp8,"
        " modelopt FP8/MXFP8, none (BF16); or pass --quantization")


def _block(key: str, block) -> tuple[int, int]:
    """A weight block size: two positive integers."""
    if not (isinstance(block, list) and len(block) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)):
        raise WarmdInputError(f"quantization_config {key} must be two positive integers, "
                              f"got {block!r}")
    return block[0], block[1]


def _ignored(qc: dict, *keys: str) -> tuple[str, ...]:
    for key in keys:
        value = qc.get(key)
        if value:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise WarmdInputError(f"quantization_config {key} must be a list of layer "
                                      f"names, got {value!r}")
            return tuple(value)
    return ()


def _compressed_tensors(qc: dict) -> Quantization:
    """compressed-tensors FP8 (W8A8 float): 'tensor' and 'channel' weight strategies run the
    scaled-mm kernels, 'block' the block-scaled FP8 linear path (DeepGEMM on Hopper), as
    vLLM's CompressedTensorsW8A8Fp8 scheme dispatches them (vllm/model_executor/layers/
    quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py)."""
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise WarmdInputError("compressed-tensors config_groups must be a JSON object")
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    if not all(isinstance(w, dict) for w in weights):
        raise WarmdInputError("compressed-tensors config_groups weights must be JSON objects")
    ignored = _ignored(qc, "ignore")
    if not weights:
        raise WarmdInputError("compressed-tensors quantization_config has no config_groups "
                              "with weights")
    kinds = {(w.get("type"), w.get("num_bits"), w.get("strategy")) for w in weights}
    if len(kinds) != 1:
        raise WarmdInputError(f"compressed-tensors with mixed weight schemes {sorted(kinds)} "
                              "is not supported; pass --quantization")
    kind, bits, strategy = kinds.pop()
    if kind != "float" or bits != 8:
        raise WarmdInputError(f"unsupported compressed-tensors weights (type={kind!r}, "
                              f"num_bits={bits!r}); supported: 8-bit float; or pass "
                              "--quantization")
    if strategy in ("tensor", "channel"):
        inputs = [g.get("input_activations") or {} for g in groups.values()
                  if isinstance(g, dict)]
        static = strategy == "tensor" and bool(inputs) and all(
            isinstance(i, dict) and i.get("dynamic") is False and i.get("strategy") == "tensor"
            for i in inputs)
        return Quantization("fp8_tensor", None, ignored, static_activations=static)
    if strategy == "block":
        block = weights[0].get("block_structure")
        return Quantization("fp8_block", _block("block_structure", block), ignored)
    raise WarmdInputError(f"unsupported compressed-tensors FP8 weight strategy {strategy!r}; "
                          "supported: tensor, channel, block")
