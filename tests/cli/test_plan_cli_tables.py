"""`warmd plan`'s tables follow the terminal: they fit its width, stack their rows when it is
narrow, and never break a key or an identifier."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from tests.plan_support import plan_json
from warmd.cli import main
from warmd.tasks import Task


def _plan_text(width: int, *args: str) -> str:
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(main, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _joined(text: str) -> str:
    """The text with every line's indentation dropped and the lines joined: an identifier
    wrapped after one of its separators reads whole here, one cut does not."""
    return "".join(line.strip() for line in text.splitlines())


@pytest.mark.parametrize("width", [60, 80, 100, 140, 240])
def test_plan_tables_fit_the_terminal_and_keep_every_identifier_whole(width):
    from warmd.cli.render import ELLIPSIS
    from warmd.warmup import WarmupOptions

    args = ("--model", "deepseek-v3", "--tp", "8", "--target", "h200", "--with", "deep_gemm",
            "--with", "flashinfer", "--disable-kernel", "FlashMLABackend",
            "--disable-kernel", "FlashAttnMLABackend", "--engine", "sglang")
    text = _plan_text(width, *args)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert ELLIPSIS not in text  # nothing is shortened: narrow means stacked, not cut
    for line in lines:  # a boxed table fits whole: none is cropped at the right edge
        if line[:1] in "┏┃┡│└":
            assert line.rstrip()[-1] in "┓┃┩│┘", line
    data = plan_json(*args)
    tasks = tuple(Task.from_json(t) for t in data["tasks"])
    assert any(len(t["key"]) > 100 for t in data["tasks"])  # longer than some lines
    joined = _joined(text)
    for task in data["tasks"]:
        key, digest = task["key"], task["key"].rsplit("/", 1)[1]
        assert key in joined
        # the digest is whole on one line, and what it says selects exactly this task
        assert any(digest in line for line in lines)
        assert [t.key for t in WarmupOptions(task_filter=digest).select(tasks)] == [key]
        if len(key) + 4 <= width:
            assert any(key in line for line in lines)  # on one line when it fits one
    for layer in data["layers"]:
        assert layer["name"] in text and (layer["kernel"] or "none") in text
    if width <= 80:  # too narrow for the layer table: a block per layer
        assert "┃ layer" not in text and "\nLayers\nself_attn.fused_qkv_a_proj" in text
    if width >= 240:
        assert "┃ layer" in text


def test_narrow_tables_stack_rows_and_wrap_identifiers_after_separators():
    from rich.console import Console

    from warmd.cli.render import Col, fitted_table, fold

    key = "flashinfer/batch_mla/batch_mla_attention_dtype_q_bf16_head_dim_512/89bc99a9801c"
    assert fold(key, 40) == ["flashinfer/batch_mla/batch_mla_",
                             "  attention_dtype_q_bf16_head_dim_512/", "  89bc99a9801c"]
    assert "".join(line.strip() for line in fold(key, 40)) == key  # every character kept
    assert fold("no-separator-needed", 40) == ["no-separator-needed"]
    columns = (Col("key", "id"), Col("M"), Col("why", "text"))
    rows = [[key, "-", "a reason that is long enough to need wrapping at this width"],
            ["deep_gemm/fp8_gemm_nt/7168x256/b070ff64df8b", "8 M values (1..8)", "-"]]

    def render(width: int) -> list[str]:
        console = Console(width=width, color_system=None, file=io.StringIO())
        console.print(fitted_table("Tasks", columns, rows, width))
        return console.file.getvalue().splitlines()

    wide = render(200)
    assert wide[1].startswith("┏") and any(key in line for line in wide)
    narrow = render(50)
    assert narrow[0] == "Tasks" and all(len(line) <= 50 for line in narrow)
    assert narrow[1:3] == ["flashinfer/batch_mla/batch_mla_attention_dtype_q_",
                           "  bf16_head_dim_512/89bc99a9801c"]
    assert narrow[3:5] == ["   why  a reason that is long enough to need",  # "-": left out
                           "          wrapping at this width"]
    assert "deep_gemm/fp8_gemm_nt/7168x256/b070ff64df8b" in narrow
    assert "   M    8 M values (1..8)" in narrow
