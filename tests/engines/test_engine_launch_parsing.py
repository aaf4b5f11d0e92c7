"""How a pasted serve command is read as the engines' argparse reads it: its spellings,
prefixes, rewrites and switches, the flag tables of the followed releases, the arguments
warmd keeps unmodelled, a hub id through the local cache only, and bad commands refused in
one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.plan_support import MODELS, assert_refused_in_one_line, from_command, model
from warmd.engines.launch import launch_request, parse_launch
from warmd.errors import WarmdInputError


def test_hub_id_resolves_only_through_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    with pytest.raises(WarmdInputError, match="never downloads"):
        launch_request("vllm serve moonshotai/Kimi-K2-Instruct -tp 8")
    repo = tmp_path / "hub" / "models--moonshotai--Kimi-K2-Instruct"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((MODELS / "kimi-k2-instruct" / "config.json")
                                          .read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    request = launch_request("vllm serve moonshotai/Kimi-K2-Instruct -tp 8")
    assert request.model == str(snapshot) and request.tp == 8


def test_launch_parsing_forms():
    launch = parse_launch(["vllm", "serve", "/m", "--tensor_parallel_size=4", "-dp", "2",
                           "--enable-expert-parallel", "--trust-remote-code", "--port", "8000"])
    assert (launch.engine, launch.model, launch.tp, launch.dp, launch.expert_parallel) == \
        ("vllm", "/m", 4, 2, True)
    launch = parse_launch("python3.12 -m sglang.launch_server --model /m --tp=8 --dp 2")
    assert (launch.engine, launch.tp, launch.dp) == ("sglang", 8, 2)


@pytest.mark.parametrize("command, expert_parallel", [
    ("vllm serve /m -tp 4 --enable-expert-parallel --no-enable-expert-parallel", False),
    ("vllm serve /m -tp 4 --no-enable-expert-parallel --enable_expert_parallel", True),
    ("vllm serve /m -tp 4 -ep --disable-expert-parallel", False),
    ("vllm serve /m -tp 4 --disable-expert-parallel -ep", True),
])
def test_the_last_expert_parallel_switch_wins(command, expert_parallel):
    # argparse stores the last occurrence; vLLM's EnableDisableAction pairs --enable-x with
    # --disable-x (vllm/utils/argparse_utils.py).
    assert parse_launch(command).expert_parallel is expert_parallel


def test_model_spellings_follow_the_engines_parsers():
    # vllm serve moves --model to the positional (FlexibleArgumentParser.parse_args).
    assert parse_launch("vllm serve -tp 2 --model /m").model == "/m"
    assert parse_launch("vllm serve --model=/m -tp 2").model == "/m"
    # ... so a positional beside --model is an argument left over: vLLM refuses it.
    with pytest.raises(WarmdInputError, match="unrecognized argument '/a'"):
        parse_launch("vllm serve /a --model /b")
    # sglang serve makes a leading positional --model-path; the last --model-path wins.
    assert parse_launch("sglang serve /a --model-path /b --tp 2").model == "/b"
    assert parse_launch("sglang serve /a --model-type llm --tp 2").model == "/a"


def test_prefixes_are_what_argparse_allows():
    # Both engines keep argparse's allow_abbrev: an unambiguous prefix is the flag.
    assert parse_launch("vllm serve /m --tensor-par 4").tp == 4
    assert parse_launch("python -m sglang.launch_server --model-path /m --tp 4 --dp 2").tp == 4
    assert parse_launch("vllm serve /m -tp 2 --enable-exp").expert_parallel
    with pytest.raises(WarmdInputError, match="ambiguous option: --max-num could match"):
        parse_launch("vllm serve /m --max-num 4096")


def test_vllm_rewrites_before_argparse():
    launch = parse_launch("vllm serve /m --max-num-batched-tokens 16K -O3 "
                          "--compilation-config.mode 3 --served-model-name a b -tp 2")
    assert (launch.max_tokens, launch.tp) == (16384, 2)
    assert parse_launch("vllm serve /m --max_num_batched_tokens=16k").max_tokens == 16000
    assert launch.unmodelled == ("--compilation-config", "--optimization-level")


def test_kernel_changing_arguments_warmd_does_not_model_are_kept_for_the_plan():
    launch = parse_launch("vllm serve /m --dtype float16 -pp 2 --port 8000 --enforce-eager")
    assert launch.unmodelled == ("-pp", "--dtype", "--enforce-eager")
    launch = parse_launch("sglang serve /m --tp 2 --enable-torch-compile --port 1")
    assert launch.unmodelled == ("--enable-torch-compile",)
    plan = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                        "--tp 2 --enable-dp-attention --fp8-gemm-backend flashinfer_trtllm "
                        "--dtype bfloat16")
    [note] = [n for n in plan.engine_notes if n.startswith("not modelled by warmd")]
    assert note.endswith("--dtype, --enable-dp-attention, --fp8-gemm-backend flashinfer_trtllm")


def test_flag_tables_come_from_the_followed_releases():
    from warmd.engines.cli_args import FOLLOWED, flag_table, option_strings

    for engine, version in FOLLOWED.items():
        table = flag_table(engine)
        assert (table["engine"], table["version"], table["allow_abbrev"]) == \
            (engine, version, True)
    vllm = option_strings("vllm")
    assert vllm["-tp"] == vllm["--tensor-parallel-size"] == "tensor_parallel_size"
    assert "--tp" not in vllm and "--disable-expert-parallel" in vllm
    sglang = option_strings("sglang")
    assert sglang["--tp-size"] == sglang["--tensor-parallel-size"] == "tp_size"


@pytest.mark.parametrize("command, message", [
    ("trtllm-serve serve /m --tp_size 8", "unknown engine command"),
    ("vllm serve {m} --tensor-parallel-size abc", "--tensor-parallel-size must be an integer"),
    ("vllm serve {m} --tensor-parallel-size 3", "--tp=3 does not divide num_attention_heads"),
    ("python -m sglang.launch_server --model-path {m} --moe-a2a-backend bogus",
     "argument --moe-a2a-backend: invalid choice: 'bogus'"),
    ("vllm serve {m} --tensor-paralel-size 4", "unrecognized argument '--tensor-paralel-size'"),
    ("vllm serve {m} --tp 4", "unrecognized argument '--tp'"),
    ("sglang serve --model-path {m} --tp-sise 4", "unrecognized argument '--tp-sise'"),
    ("vllm serve {m} --foo-bar", "unrecognized argument '--foo-bar'"),
    ("python -m sglang.launch_server --model-path {m} --foo-bar", "unrecognized argument"),
    ("vllm serve {m} -tp", "argument --tensor-parallel-size/-tp: expected one argument"),
    ("vllm serve {m} --kv-cache-dtype fp9", "--kv-cache-dtype 'fp9'"),
    ("vllm serve --port 8000", "names no model"),
])
def test_bad_serve_commands_are_one_line_exit_2(command, message, tmp_path):
    argv = command.format(m=model("qwen3-30b-a3b-fp8")).split()
    for sub in ("plan", "warmup"):
        assert_refused_in_one_line(tmp_path, sub, argv, message)


@pytest.mark.parametrize("args, message", [
    (["--tp", "8", "--ep", "2"], "--ep must be 1 or 8 (--tp 8 x --dp 1), got 2"),
    (["--tp", "2", "--dp", "2", "--ep", "2"], "--ep must be 1 or 4"),
])
def test_vllm_rejects_ep_other_than_tp_x_dp(args, message):
    result = subprocess.run([sys.executable, "-m", "warmd", "plan", "--model",
                             model("qwen3-30b-a3b-fp8"), "--target", "h200", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"warmd: error: {result.stderr.strip()[14:]}"]
    assert message in result.stderr


def test_flags_and_command_conflict():
    result = subprocess.run([sys.executable, "-m", "warmd", "plan", "--tp", "2", "--target",
                             "h200", "--", "vllm", "serve", model("llama-3.1-8b-instruct")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--tp conflicts with the serve command" in result.stderr
