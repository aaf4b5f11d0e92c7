"""warmd.yaml: loading, validation (one line, exit 2), overrides, and what changes a re-warm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from warmd.cli import main
from warmd.config import DEFAULT_CONFIG, NodeSelector, expand_path, schema_keys
from warmd.config.load import load_config, read_config_file
from warmd.config.parse import config_from_json, parse_config
from warmd.errors import WarmdInputError

MINIMAL = {"models": [{"path": "llama-3.1-8b"}]}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("WARMD_CONFIG", "WARMD_REDIS_URL", "WARMD_NAMESPACE", "WARMD_SIGNING_KEY_FILE",
                "WARMD_METRICS_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))


def write(tmp_path, data, name="warmd.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def error_of(data) -> str:
    with pytest.raises(WarmdInputError) as info:
        parse_config(data, "w.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_embedded_default_plans_one_small_flashinfer_module():
    from warmd.plan import make_plan
    from warmd.warmup import WarmupOptions

    config = load_config()
    assert config.source == str(DEFAULT_CONFIG)
    assert config.redis.url is None and config.builders.enabled
    [model] = config.models
    plan = make_plan(model.plan_request(target=config.builders.target))
    selected = WarmupOptions(libraries=model.libraries,
                             task_filter=model.task_filter).select(plan.tasks)
    assert [t.module for t in selected] == ["silu_and_mul"]


def test_full_config_parses(tmp_path):
    config = read_config_file(write(tmp_path, {
        "version": 1,
        "models": [{"name": "ds", "path": "/m/ds", "tp": 8, "ep": 8, "engine": "vllm",
                    "mode": "fast", "max_tokens": 4096, "target": "h200",
                    "with": ["deep_gemm"], "without": ["flashinfer"], "m_list": [1, 2, 4],
                    "libraries": ["deep_gemm"], "task_filter": "fp8"}],
        "redis": {"url": "rediss://writer:pw@redis:6380/0", "namespace": "prod"},
        "cache": {"deep_gemm_dir": "/c/dg", "flashinfer_workspace": "~/fi"},
        "signing_key_file": "/etc/warmd/key",
        "nodes": {"labels": {"pool": "gpu"}, "gpu_types": ["H200", "H100"]},
        "builders": {"enabled": True, "target": "h100"},
        "agent": {"reconcile_seconds": 1, "heartbeat_seconds": 2.5, "metrics_port": 0}}))
    [model] = config.models
    assert (model.tp, model.ep, model.m_list, model.with_libs) == (8, 8, "1,2,4", ("deep_gemm",))
    request = model.plan_request()
    assert request.target == "h200" and request.without_libs == ("flashinfer",)
    assert config.nodes.labels == (("pool", "gpu"),)
    assert config.agent.heartbeat_seconds == 2.5 and config.agent.metrics_port == 0
    assert config.cache.env()["FLASHINFER_WORKSPACE_BASE"] == os.path.expanduser("~/fi")


@pytest.mark.parametrize("data, expected", [
    ({"models": [{"path": "x"}], "modles": []},
     "w.yaml: config: unknown key 'modles'"),
    ({"models": [{"path": "x", "tpp": 8}]}, "w.yaml: models[0]: unknown key 'tpp'"),
    ({"models": [{"path": "x", "tp": "eight"}]},
     "w.yaml: models[0].tp: expected an integer, got 'eight'"),
    ({"models": [{"path": "x", "tp": True}]}, "w.yaml: models[0].tp: expected an integer"),
    ({"models": [{"path": "x", "tp": 0}]}, "w.yaml: models[0].tp: must be positive"),
    ({"models": [{"tp": 1}]}, "w.yaml: models[0]: missing required key 'path'"),
    ({"models": [{"path": "x", "engine": "trt"}]}, "models[0].engine: unknown engine 'trt'"),
    ({"models": [{"path": "x", "mode": "all"}]}, "models[0].mode: unknown mode 'all'"),
    ({"models": [{"path": "x", "libraries": ["cutlass"]}]}, "unknown library 'cutlass'"),
    ({"models": [{"path": "x", "task_filter": "("}]}, "not a valid regular expression"),
    ({"models": [{"path": "x", "m_list": [1, -2]}]}, "m_list: expected positive integers"),
    ({"models": []}, "w.yaml: models: expected a non-empty list of models"),
    ({}, "w.yaml: models: expected a non-empty list"),
    ({"models": [{"path": "a/x"}, {"path": "b/x"}]}, "model names must be unique"),
    ({**MINIMAL, "redis": {"url": 6379}}, "w.yaml: redis.url: expected a string, got 6379"),
    ({**MINIMAL, "redis": "localhost"}, "w.yaml: redis: expected a mapping"),
    ({**MINIMAL, "nodes": {"labels": {"a": 1}}}, "nodes.labels: expected a mapping of strings"),
    ({**MINIMAL, "nodes": {"gpu_types": "H200"}}, "nodes.gpu_types: expected a list"),
    ({**MINIMAL, "builders": {"enabled": "yes"}}, "builders.enabled: expected true or false"),
    ({**MINIMAL, "agent": {"metrics_port": 70000}}, "agent.metrics_port: must be 0..65535"),
    ({**MINIMAL, "agent": {"reconcile_seconds": 0}}, "agent.reconcile_seconds: must be positive"),
    ({**MINIMAL, "agent": {"reconcile_seconds": float("nan")}},
     "agent.reconcile_seconds: must be positive"),
    ({**MINIMAL, "agent": {"heartbeat_seconds": float("inf")}},
     "agent.heartbeat_seconds: must be positive"),
    ({**MINIMAL, "version": 2}, "unsupported config version 2"),
    (["models"], "w.yaml: config: expected a mapping"),
])
def test_bad_configs_fail_with_one_line_naming_the_field(data, expected):
    assert expected in error_of(data)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "models:\n  - path: x\n   tp: 1\n")
    with pytest.raises(WarmdInputError, match=r"not valid YAML \(line 3, column 4\)"):
        read_config_file(path)
    with pytest.raises(WarmdInputError, match="config file not found"):
        read_config_file(tmp_path / "missing.yaml")


def test_a_model_path_missing_here_is_not_a_load_error(tmp_path):
    config = read_config_file(write(tmp_path, {"models": [{"path": "/nowhere/model"}]}))
    assert config.models[0].path == "/nowhere/model" and config.models[0].name == "model"


def test_paths_expand_on_the_node(monkeypatch):
    monkeypatch.setenv("MODELS_HERE", "/data/models")
    config = parse_config({"models": [{"path": "$MODELS_HERE/ds"}],
                           "cache": {"deep_gemm_dir": "${MODELS_HERE}/dg"}})
    assert config.models[0].plan_request().model == "/data/models/ds"
    assert config.cache.env() == {"DG_JIT_CACHE_DIR": "/data/models/dg"}
    assert expand_path("~") == os.path.expanduser("~")


def test_precedence_file_then_env_then_flags(tmp_path, monkeypatch):
    path = write(tmp_path, {**MINIMAL, "redis": {"url": "redis://file:1/0", "namespace": "f"},
                            "signing_key_file": "/file/key"})
    monkeypatch.setenv("WARMD_CONFIG", str(path))
    assert load_config().redis.url == "redis://file:1/0"
    monkeypatch.setenv("WARMD_REDIS_URL", "redis://env:2/0")
    monkeypatch.setenv("WARMD_NAMESPACE", "e")
    monkeypatch.setenv("WARMD_SIGNING_KEY_FILE", "/env/key")
    monkeypatch.setenv("WARMD_METRICS_PORT", "9000")
    config = load_config()
    assert (config.redis.url, config.redis.namespace, config.signing_key_file,
            config.agent.metrics_port) == ("redis://env:2/0", "e", "/env/key", 9000)
    config = load_config(redis_url="redis://flag:3/0", namespace="x", metrics_port=0)
    assert (config.redis.url, config.redis.namespace, config.agent.metrics_port) == (
        "redis://flag:3/0", "x", 0)
    monkeypatch.setenv("WARMD_METRICS_PORT", "many")
    with pytest.raises(WarmdInputError, match="WARMD_METRICS_PORT must be a port number"):
        load_config()
    monkeypatch.delenv("WARMD_METRICS_PORT")
    with pytest.raises(WarmdInputError, match="invalid Redis URL 'http://x'"):
        load_config(redis_url="http://x")
    assert load_config(redis_url="off").redis.url == "off"


def test_json_roundtrip_and_work_hash():
    config = parse_config({"models": [{"path": "llama-3.1-8b", "with": ["flashinfer"]}],
                           "redis": {"url": "redis://w:s3cret@h:1/0"},
                           "nodes": {"labels": {"a": "b"}}})
    assert config_from_json(config.to_json()) == config
    public = config.public_json()
    assert public["redis"]["url"] == "redis://w:***@h:1/0" and "s3cret" not in str(public)
    assert config_from_json(public).work_hash() == config.work_hash()

    def variant(**changes) -> str:
        data = config.to_json()
        for section, values in changes.items():
            if section == "models":
                data["models"][0].update(values)
            else:
                data[section].update(values)
        return config_from_json(data).work_hash()

    base = config.work_hash()
    assert variant(agent={"heartbeat_seconds": 9, "metrics_port": 1}) == base
    assert variant(nodes={"gpu_types": ["H100"]}) == base  # who is warmed, not what
    assert variant(models={"max_tokens": 4096}) != base
    assert variant(redis={"url": "redis://other:1/0"}) != base
    assert variant(redis={"namespace": "n2"}) != base
    assert variant(cache={"flashinfer_workspace": "/x"}) != base


def test_node_selector():
    sel = NodeSelector(labels=(("pool", "gpu"),), gpu_types=("H200",))
    assert sel.matches({"pool": "gpu"}, 8, "H200", builders=False)
    assert sel.matches({"pool": "gpu"}, 8, "h200", builders=False)
    assert not sel.matches({"pool": "cpu"}, 8, "H200", builders=False)
    assert not sel.matches({"pool": "gpu"}, 8, "H100", builders=False)
    assert not sel.matches({"pool": "gpu"}, 0, None, builders=False)
    assert sel.matches({"pool": "gpu"}, 0, None, builders=True)
    assert NodeSelector().matches({}, 1, None, builders=False)


@pytest.mark.parametrize("command", [["start"], ["status"], ["wait-ready", "--timeout", "1"],
                                     ["warmup", "--from-config"]])
def test_cli_refuses_a_malformed_config_before_doing_anything(tmp_path, command):
    bad = write(tmp_path, {"models": [{"path": "x", "tp": "eight"}]})
    args = command + [str(bad)] if command[-1] == "--from-config" else command + [
        "--config", str(bad)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"warmd: error: {bad}: models[0].tp: expected an integer, got 'eight'"]
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


def test_warmd_config_env_with_a_bad_file_is_exit_2_in_a_real_process(tmp_path):
    bad = write(tmp_path, "models: [\n")
    done = subprocess.run([sys.executable, "-m", "warmd", "start", "--no-wait"],
                          env={**os.environ, "WARMD_CONFIG": str(bad),
                               "WARMD_STATE_DIR": str(tmp_path / "state")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not valid YAML" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("data, expected", [
    ({"models": [{"path": "x"}], "modles": []},
     "w.yaml: config: unknown key 'modles' (did you mean 'models'?)"),
    ({"models": [{"path": "x", "tpp": 8}]}, "models[0]: unknown key 'tpp' (did you mean 'tp'?)"),
    ({"models": [{"path": "x", "with_libs": []}]}, "(did you mean 'with'?)"),
    ({**MINIMAL, "cache": {"triton_dir": "/t"}}, "(did you mean 'triton_cache_dir'?)"),
    ({**MINIMAL, "agent": {"metric_port": 1}}, "(did you mean 'metrics_port'?)"),
    ({**MINIMAL, "zzz": 1}, "unknown key 'zzz' (known: "),  # nothing close: every key
])
def test_a_mistyped_key_names_the_one_it_resembles(data, expected):
    assert expected in error_of(data)


def test_cli_says_did_you_mean_in_one_line_exit_2(tmp_path):
    bad = write(tmp_path, {**MINIMAL, "redis": {"namspace": "x"}})
    result = CliRunner().invoke(main, ["status", "--config", str(bad)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"warmd: error: {bad}: redis: unknown key 'namspace' (did you mean 'namespace'?)"]


def test_the_docs_table_is_every_config_key_and_nothing_else():
    """docs/daemon.md's "every key" table, held to the schema written in warmd/config.py."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "daemon.md").read_text()
    table = docs.split("every key:", 1)[1].split("\n\n", 2)[1]
    documented = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert documented == list(schema_keys())
    assert {"models[].engine_command", "models[].env", "cache.triton_cache_dir"} <= set(
        documented)
    # every key of the embedded example is in the schema
    example = yaml.safe_load(DEFAULT_CONFIG.read_text())
    flat = {f"models[].{k}" for m in example["models"] for k in m}
    flat |= {f"{s}.{k}" for s, v in example.items() if isinstance(v, dict) for k in v}
    assert flat <= set(documented)
