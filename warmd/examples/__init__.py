"""Model configs bundled with warmd, usable by name: `warmd plan --model deepseek-v3`."""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent


def example_names() -> list[str]:
    return sorted(p.parent.name for p in EXAMPLES_DIR.glob("*/config.json"))


def resolve_model_path(model: str) -> str:
    """A path as given, or a bundled example's directory when no such path exists."""
    if Path(model).expanduser().exists() or model not in example_names():
        return model
    return str(EXAMPLES_DIR / model)
