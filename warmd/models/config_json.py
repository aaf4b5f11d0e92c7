"""A checkpoint's config.json read within bounds, and each field a builder reads checked:
bad input is refused in one line before planning."""

from __future__ import annotations

from pathlib import Path

from warmd import boundedjson
from warmd.errors import WarmdInputError

# What a config.json may be: real ones are a few KiB (the largest seen, with label maps, well
# under 1 MiB) and nest 3 deep (quantization_config.config_groups.group_0.weights).
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_CONFIG_DEPTH = 32
# Each count and size a builder reads, bounded to what real models use with headroom
# (largest seen in brackets; docs/models.md). Beyond: bad input, refused before planning.
FIELD_BOUNDS = {
    "num_hidden_layers": 1024,  # 126 (Llama 3.1 405B)
    "hidden_size": 131072,  # 18432 (Nemotron-4 340B)
    "intermediate_size": 1 << 20,  # 73728 (Nemotron-4 340B)
    "moe_intermediate_size": 1 << 20,  # 2048 (DeepSeek-V3)
    "num_attention_heads": 1024,  # 128 (DeepSeek-V3, Llama 405B)
    "num_key_value_heads": 1024,  # 128 (DeepSeek-V3)
    "head_dim": 4096,  # 256 (Gemma)
    "num_experts": 4096,  # 512 (Qwen3-Next)
    "num_local_experts": 4096,
    "n_routed_experts": 4096,  # 384 (Kimi K2)
    "num_experts_per_tok": 1024,  # 10 (Qwen3-Next)
    "n_shared_experts": 1024,  # 2 (DeepSeek-V2)
    "vocab_size": 1 << 22,  # 262144 (Gemma 3)
    "kv_lora_rank": 65536,  # 512 (DeepSeek-V3)
    "q_lora_rank": 65536,  # 1536 (DeepSeek-V3)
    "qk_nope_head_dim": 65536,
    "qk_rope_head_dim": 65536,
    "v_head_dim": 65536,
}
DEFAULT_BOUND = 1 << 22  # any other integer field a builder reads
MAX_LAYER_LIST = FIELD_BOUNDS["num_hidden_layers"]  # mlp_only_layers and the like


def load_config(path: str | Path) -> tuple[dict, Path]:
    """Read a local config.json (a file, or a directory holding one). Never downloads. At
    most MAX_CONFIG_BYTES, nested at most MAX_CONFIG_DEPTH deep."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise WarmdInputError(f"model config not found: {p}")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise WarmdInputError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    try:
        data = boundedjson.loads(raw, MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH)
    except boundedjson.NotJson as exc:
        raise WarmdInputError(f"model config {p} is not valid JSON: {exc}") from None
    except boundedjson.JsonRefused as exc:
        raise WarmdInputError(f"model config {p} refused: {exc}") from None
    if not isinstance(data, dict):
        raise WarmdInputError(f"model config {p} must hold a JSON object")
    return data, p


def bounded(key: str, value: int) -> int:
    bound = FIELD_BOUNDS.get(key, DEFAULT_BOUND)
    if value > bound:
        raise WarmdInputError(f"model config field {key!r} is {value}, over warmd's bound of "
                              f"{bound} (real models stay far below it)")
    return value


def require(config: dict, *keys: str) -> list[int]:
    values = []
    for key in keys:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise WarmdInputError(f"model config field {key!r} must be a positive integer, "
                                  f"got {short(value)}")
        values.append(bounded(key, value))
    return values


def short(value: object) -> str:
    """A value as an error line shows it: never more than a line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def optional(config: dict, key: str, default: int, minimum: int = 1) -> int:
    """An optional integer field: absent or null is the default; anything else must be an
    integer >= minimum (the engines build the model from it and refuse other values)."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise WarmdInputError(f"model config field {key!r} must be {what}, "
                              f"got {short(value)}")
    return bounded(key, value)


def int_list(config: dict, key: str) -> list[int]:
    value = config.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_LAYER_LIST or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise WarmdInputError(f"model config field {key!r} must be a list of at most "
                              f"{MAX_LAYER_LIST} layer indexes, got {short(value)}")
    return value


def text_field(config: dict, key: str, default: str) -> str:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise WarmdInputError(f"model config field {key!r} must be a name, got {value!r}")
    return value
