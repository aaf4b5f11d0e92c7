"""Serve lines as users type them are read as the engines' own parsers read them: a corpus of
real launches from the engines' docs, recipes and deployment guides (tests/data/
serve_lines.txt, each entry naming its source), vLLM's switches in every spelling, a release
newer than warmd's rules, and the flag tables checked against the engines' source."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from wheels import release_source

from warmd.engines.launch import parse_launch
from warmd.errors import WarmdInputError

DATA = Path(__file__).parents[1] / "data"
MODEL = str(DATA / "models" / "qwen3-30b-a3b-fp8")
_BOOLS = {"True": True, "False": False}


def corpus() -> list[tuple[str, str, dict]]:
    """(source, command, expected fields) of every entry of serve_lines.txt."""
    entries, source = [], []
    command = None
    for line in (DATA / "serve_lines.txt").read_text().splitlines():
        if line.startswith("# from:"):
            source, command = [line[len("# from:"):].strip()], None
        elif line.startswith("=> "):
            expected = {}
            for item in shlex.split(line[3:]):
                key, value = item.split("=", 1)
                expected[key] = _BOOLS.get(value, int(value) if value.isdigit() else value)
            entries.append((" ".join(source), command, expected))
        elif line and not line.startswith("#") and source:
            command = line
    return entries


CORPUS = corpus()


def test_the_corpus_is_forty_real_launches_or_more():
    assert len(CORPUS) >= 40
    assert all(source and command and expected for source, command, expected in CORPUS)
    engines = {command.split()[0] for _, command, _ in CORPUS}
    assert {"vllm", "python3", "sglang"} <= engines


@pytest.mark.parametrize("source, command, expected", CORPUS,
                         ids=[f"{i:02d}" for i in range(len(CORPUS))])
def test_every_corpus_launch_is_accepted_and_read(source, command, expected):
    launch = parse_launch(command)
    for key, value in expected.items():
        assert getattr(launch, key) == value, (source, key)


def test_prefix_caching_and_chunked_prefill_are_switches_in_every_spelling():
    # vllm/engine/arg_utils.py adds them as **{**cache_kwargs[...], "default": None}: bool
    # fields, so BooleanOptionalAction, registered as EnableDisableAction.
    from warmd.engines.cli_args import parse_engine_args

    parsed = parse_engine_args("vllm", ["/m", "--enable-prefix-caching",
                                        "--enable-chunked-prefill",
                                        "--no-enable-prefix-caching"], True)
    assert parsed.values["enable_prefix_caching"] is False
    assert parsed.values["enable_chunked_prefill"] is True
    parsed = parse_engine_args("vllm", ["/m", "--disable-chunked-prefill",
                                        "--enable_prefix_caching"], True)
    assert parsed.values["enable_chunked_prefill"] is False
    assert parsed.values["enable_prefix_caching"] is True
    with pytest.raises(WarmdInputError, match="ignored explicit argument"):
        parse_engine_args("vllm", ["/m", "--enable-prefix-caching=yes"], True)


def _warmd(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", *args], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path),
                               "WARMD_STATE_DIR": str(tmp_path / "state")})


def test_a_production_switch_line_plans(tmp_path):
    result = _warmd("plan", "--target", "h200", "--with", "deep_gemm", "--with", "flashinfer",
                    "--json", "--", "vllm", "serve", MODEL, "-tp", "2",
                    "--enable-prefix-caching", "--enable-chunked-prefill",
                    "--no-enable-prefix-caching", "--max-num-batched-tokens", "4096",
                    tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"max_tokens": 4096' in result.stdout


def test_a_newer_release_says_whose_rules_apply_and_passes_new_flags(tmp_path):
    args = ("plan", "--target", "h200", "--with", "deep_gemm", "--with", "flashinfer",
            "--engine-version", "0.99.0", "--", "vllm", "serve", MODEL, "-tp", "2",
            "--brand-new-kernel-flag", "3", "--another-new-switch")
    result = _warmd(*args, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "vllm 0.99.0" in line and "vllm 0.34.0's rules" in line
    assert "--brand-new-kernel-flag 3, --another-new-switch" in result.stdout
    # The followed release itself refuses the flag, as vLLM 0.34.0 would.
    followed = _warmd(*[a if a != "0.99.0" else "0.34.0" for a in args], tmp_path=tmp_path)
    assert followed.returncode == 2
    assert "unrecognized argument '--brand-new-kernel-flag'" in followed.stderr
    # A newer release still refuses what the followed parser refuses for a known flag, but
    # not a value it may have added to a flag's choices.
    with pytest.raises(WarmdInputError, match="expected one argument"):
        parse_launch(["vllm", "serve", MODEL, "-tp"], version="0.99.0")
    new_value = ["vllm", "serve", MODEL, "--all2all-backend", "brand_new_a2a"]
    assert parse_launch(new_value, version="0.99.0").all2all_backend == "brand_new_a2a"
    with pytest.raises(WarmdInputError, match="invalid choice: 'brand_new_a2a'"):
        parse_launch(new_value, version="0.34.0")


def test_a_serve_line_of_an_unknown_engine_is_one_line_exit_2(tmp_path):
    result = _warmd("plan", "--target", "h200", "--", "trtllm-serve", "serve", MODEL,
                    "--tp_size", "8", tmp_path=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "unknown engine command 'trtllm-serve serve" in line


SOURCES = Path(os.environ.get("WARMD_ENGINE_SOURCES", "/tmp/engines"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_flag_tables_are_what_the_engine_source_gives(engine, tmp_path, tmp_path_factory):
    """The committed tables record the digest of the source they were read from; with the
    followed release's unpacked wheel here, regenerating them gives the committed files."""
    import json

    from warmd.engines.cli_args import FLAGS_DIR, FOLLOWED

    version = FOLLOWED[engine]
    names = (f"{engine}-{version}.json", f"{engine}-{version}-moe-configs.json")
    table = json.loads((FLAGS_DIR / names[0]).read_text())
    assert len(table["source_digest"]) == 16 and table["version"] == version
    tree = release_source(engine, version, tmp_path_factory.getbasetemp() / "releases")
    result = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "tools" /
                                                  "engine_flags.py"), "--out", str(tmp_path),
                             str(tree)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    for name in names:
        assert (tmp_path / name).read_text() == (FLAGS_DIR / name).read_text(), name


# The engines' Python dependencies (never the project's venv), for their own parsers.
DEPS = Path(os.environ.get("WARMD_ENGINE_DEPS", "/tmp/vdeps"))
# Arguments whose choices the engine computes at import from the platform or a registry:
# warmd's table leaves them free (it never refuses a value the engine takes).
FREE_CHOICES = {"vllm": {"mm_processor_device"},
                "sglang": {"kv_canary_real_data", "linear_attn_verify_backend",
                           "lora_target_modules", "reasoning_parser", "sampling_backend",
                           "tool_call_parser"}}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_flag_tables_match_the_engines_own_parsers(engine):
    from warmd.engines.cli_args import FOLLOWED

    tree = SOURCES / f"{engine}-{FOLLOWED[engine]}"
    if not tree.is_dir() or not DEPS.is_dir():
        pytest.skip(f"no unpacked {engine} and its dependencies ({SOURCES}, {DEPS})")
    result = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "tools" /
                                                  "engine_parser_check.py"), engine, str(tree),
                             "--deps", str(DEPS)], capture_output=True, text=True,
                            timeout=600)
    if result.returncode == 2:
        pytest.skip(f"the engine's parser does not build here: {result.stderr.strip()}")
    lines = result.stdout.strip().splitlines()
    assert ", 0 refused" in lines[0], result.stdout  # every corpus line, by the engine
    differing = {line.split(":")[0].strip() for line in lines[1:]}
    assert differing <= FREE_CHOICES[engine], result.stdout
    assert all(": choices engine" in line for line in lines[1:]), result.stdout
