"""deploy/: every manifest validates offline (Kubernetes' own schemas, KubeRay's RayCluster
CRD), has what its system requires, references only what the repo creates, and every warmd
command in it exists in the CLI with those flags; the image's Dockerfile installs the project
as packaged (deploy/'s Redis: test_deploy_redis.py; its systemd units:
test_deploy_systemd.py)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deploy_support import (
    DEPLOY,
    ROOT,
    SETTINGS,
    check_cli,
    containers,
    generated_secrets,
    kuberay_objects,
    warmd_commands,
)

from warmd.config.parse import parse_config

# --- KubeRay ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kuberay():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "raycluster.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def test_kuberay_manifest_shape(kuberay):
    assert set(kuberay) == {"ConfigMap", "RayCluster"}
    cluster = kuberay["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    groups = cluster["spec"]["workerGroupSpecs"]
    assert groups and all(g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] for g in groups)
    for name, pod in containers(cluster).items():
        [container] = pod["containers"]
        assert container["image"] and container["command"] == ["/bin/bash", "-lc", "--"]
        script = container["args"][0]
        assert "$KUBERAY_GEN_RAY_START_CMD" in script, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, f"{name}: mount of undeclared {mount['name']}"
        config_maps = {v["configMap"]["name"] for v in volumes.values() if "configMap" in v}
        assert config_maps <= {kuberay["ConfigMap"]["metadata"]["name"]}
        for env in container["env"]:
            if env["name"].startswith("WARMD_"):
                assert f'"{env["name"]}"' in SETTINGS, f"{env['name']} is no warmd setting"


def test_kuberay_config_is_a_valid_warmd_yaml(kuberay):
    config = parse_config(yaml.safe_load(kuberay["ConfigMap"]["data"]["warmd.yaml"]))
    cluster = kuberay["RayCluster"]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]
    port = str(config.agent.metrics_port)
    assert worker["metadata"]["annotations"]["prometheus.io/port"] == port
    assert config.agent.metrics_host == "0.0.0.0"  # scraped at the pod's IP: named here
    [container] = worker["spec"]["containers"]
    assert {p["containerPort"] for p in container["ports"]} == {config.agent.metrics_port}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for model in config.models:
        assert any(model.path.startswith(m + "/") for m in mounts), model.path
    assert any(config.signing_key_file.startswith(m + "/") for m in mounts)
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_kuberay_head_starts_the_controller_and_workers_prejoin(kuberay):
    pods = containers(kuberay["RayCluster"])
    head = pods.pop("head")["containers"][0]
    head_cmds = warmd_commands(head["args"][0])
    assert [c[1] for c in head_cmds] == ["start"]
    assert "--no-wait" in head_cmds[0]
    config_path = next(e["value"] for e in head["env"] if e["name"] == "WARMD_CONFIG")
    mounts = {m["mountPath"] for m in head["volumeMounts"]}
    assert str(Path(config_path).parent) in mounts
    for pod in pods.values():
        [worker] = pod["containers"]
        script = worker["args"][0]
        cmds = warmd_commands(script)
        assert cmds[0][:3] == ["warmd", "warmup", "--from-config"]
        assert str(Path(cmds[0][3]).parent) in {m["mountPath"] for m in worker["volumeMounts"]}
        lines = script.splitlines()
        prejoin = next(i for i, line in enumerate(lines) if "--from-config" in line)
        join = next(i for i, line in enumerate(lines) if "$KUBERAY_GEN_RAY_START_CMD" in line)
        assert prejoin < join  # warm before joining
        probe = worker["readinessProbe"]["exec"]["command"]
        cmds += warmd_commands(probe[-1])
        assert any(c[1] == "wait-ready" for c in cmds)
        for cmd in cmds:
            check_cli(cmd)
    for cmd in head_cmds:
        check_cli(cmd)


def test_kuberay_worker_join_label_parses_as_ray_parses_it(kuberay):
    label_utils = pytest.importorskip("ray._private.label_utils")
    pods = containers(kuberay["RayCluster"])
    pods.pop("head")
    for pod in pods.values():
        [worker] = pod["containers"]
        join = next(line for line in worker["args"][0].splitlines()
                    if "$KUBERAY_GEN_RAY_START_CMD" in line)
        label = re.search(r"--labels=(\S+)", join).group(1)
        for warm in ("true", "false"):
            assert label_utils.parse_node_labels_string(label.replace("$warm", warm)) == {
                "warmd.io/warm": warm}


def kubelet_env(container: dict) -> dict[str, str]:
    """The container's literal variables as the kubelet sets them: `$(NAME)` expands to an
    earlier variable of the list, and is left as written otherwise."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                       lambda m: env.get(m.group(1), m.group(0)),
                                       item["value"])
    return env


def engine_gate(script: str) -> list[str]:
    """The serve command of the `warmd verify -- ...` gate in a worker's script."""
    [verify] = [c for c in warmd_commands(script) if c[1] == "verify"]
    return verify[verify.index("--") + 1:]


def test_the_engines_environment_resolves_to_the_directories_the_agent_fills(kuberay,
                                                                              monkeypatch):
    """The engine runs in the GPU worker's container (a Ray node): by warmd's rules, its
    environment gives the engine the very directories warmd's agent warms for each configured
    model (the agent reads the same environment, with warmd.yaml's `cache:` and `env:` on
    top), all on the kernel-cache volume, resolvable without knowing the user's home; the
    gate verifies the configured serve line."""
    from warmd.cluster.work import node_context
    from warmd.engines.cache_dirs import CACHE_VARIABLES, process_cache_dirs, resolve
    from warmd.engines.versions import resolve_version

    config = parse_config(yaml.safe_load(kuberay["ConfigMap"]["data"]["warmd.yaml"]))
    pods = containers(kuberay["RayCluster"])
    pods.pop("head")
    for pod in pods.values():
        [worker] = pod["containers"]
        env = kubelet_env(worker)
        volumes = {v["name"]: v for v in pod["volumes"]}
        shared = [m["mountPath"] for m in worker["volumeMounts"]
                  if "emptyDir" in volumes[m["name"]] or "hostPath" in volumes[m["name"]]]
        for name in CACHE_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        gated = []
        for model in config.models:
            request = model.plan_request()
            version, _ = resolve_version(request.engine, request.engine_version)
            engine = resolve(request.engine, {**env, **dict(request.engine_env or ())}, None,
                             version)
            context = node_context(config)  # the agent's
            agent = process_cache_dirs(request.engine, version, request.engine_env or (),
                                       context.environ)
            assert agent.directories() == engine.directories(), model.name
            for directory in engine.directories().values():
                assert any(directory.is_relative_to(m) for m in shared), directory
            gated.append(list(model.engine_command))
        assert engine_gate(worker["args"][0]) in gated


def test_a_manifest_variable_warmd_cannot_resolve_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_CACHE_DIR", "_BASE"))}
    env["SGLANG_CACHE_DIR"] = "$(KERNEL_CACHE)/sglang"  # the kubelet left it: no such variable
    out = subprocess.run([sys.executable, "-m", "warmd", "verify", "-t", "h200", "--",
                          "python", "-m", "sglang.launch_server", "--model-path",
                          str(ROOT / "tests" / "data" / "models" / "qwen3-30b-a3b-fp8")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "SGLANG_CACHE_DIR=$(KERNEL_CACHE)/sglang is not an absolute path" in out.stderr


def test_command_checker_catches_what_does_not_exist():
    with pytest.raises(AssertionError, match="no `warmd launch`"):
        check_cli(["warmd", "launch"])
    with pytest.raises(AssertionError, match="has no --detach"):
        check_cli(["warmd", "start", "--detach"])
    assert warmd_commands("a && /usr/bin/warmd stop --address x; b") == [
        ["/usr/bin/warmd", "stop", "--address", "x"]]


# --- offline validation ----------------------------------------------------------------------

# The oldest Kubernetes the manifests are meant for, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
RAYCLUSTER_SCHEMA = ROOT / "tests" / "data" / "kuberay" / "raycluster-v1.schema.json"


def strict(schema):
    """A CRD schema that refuses unknown fields, as `kubectl apply --validate=strict` does
    (the API server would otherwise drop them without a word)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def raycluster_schema():
    return strict(json.loads(RAYCLUSTER_SCHEMA.read_text()))


def validate(doc: dict, raycluster_schema: dict) -> None:
    if doc["apiVersion"] == "ray.io/v1":
        assert doc["kind"] == "RayCluster"
        jsonschema.validate(doc, raycluster_schema)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_kubernetes_object_validates_offline(raycluster_schema):
    docs = kuberay_objects()
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "Service", "StatefulSet",
                                         "PersistentVolumeClaim", "RayCluster", "Secret"}
    for doc in docs:
        validate(doc, raycluster_schema)


def test_the_validators_refuse_a_misspelled_field(kuberay, raycluster_schema):
    cluster = json.loads(json.dumps(kuberay["RayCluster"]))
    container = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    with pytest.raises(jsonschema.ValidationError, match="volumeMount"):
        validate(cluster, raycluster_schema)
    secret = generated_secrets()[0]
    secret["stringdata"] = secret.pop("stringData")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(secret, raycluster_schema)


def test_the_manifests_reference_only_what_the_repo_creates():
    """Every Secret (and key), ConfigMap and claim a pod uses is created by the documented
    steps, in the namespace the pods run in."""
    docs = kuberay_objects()
    made = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    namespace = made["Namespace", "warmd"]["metadata"]["name"]
    assert all(d["metadata"].get("namespace") == namespace for d in docs if d["kind"] !=
               "Namespace")

    def keys(kind: str, name: str) -> set[str]:
        assert (kind, name) in made, f"nothing creates the {kind} {name}"
        return set(made[kind, name].get("stringData") or made[kind, name].get("data") or {})

    pods = [made["StatefulSet", "redis"]["spec"]["template"]["spec"],
            *containers(made["RayCluster", "warmd-gpu"]).values()]
    for pod in pods:
        for volume in pod["volumes"]:
            if "secret" in volume:
                wanted = {i["key"] for i in volume["secret"].get("items", [])}
                assert wanted <= keys("Secret", volume["secret"]["secretName"])
            elif "configMap" in volume:
                keys("ConfigMap", volume["configMap"]["name"])
            elif "persistentVolumeClaim" in volume:
                keys("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        for container in pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in keys("Secret", ref["name"])


def dockerfile() -> dict:
    """deploy/docker/Dockerfile's instructions: {"ARG": {name: default}, "COPY": [[...]],
    "RUN": [...], "USER": ..., "ENTRYPOINT": [...], "FROM": ..., "build": the documented
    `docker build` command}."""
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    out: dict = {"ARG": {}, "COPY": [], "RUN": []}
    out["build"] = shlex.split(re.search(r"^#\s+(docker build .*)$", text, re.M).group(1))
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, rest = line.split(None, 1)
        if word == "ARG":
            name, _, default = rest.partition("=")
            out["ARG"][name] = default
        elif word in ("COPY", "RUN"):
            out[word].append(rest)
        elif word == "ENTRYPOINT":
            out[word] = json.loads(rest)
        else:
            out[word] = rest.strip()
    return out


def test_the_dockerfile_builds_the_image_the_manifests_run(kuberay):
    image = dockerfile()
    tag = image["build"][image["build"].index("-t") + 1]
    for pod in containers(kuberay["RayCluster"]).values():
        assert {c["image"] for c in pod["containers"]} == {tag}
    # warmd:<the version pyproject.toml builds>
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert tag == f"warmd:{version.group(1)}"
    # Ray's image of the RayCluster's Ray version (a CUDA one: the JIT builds need nvcc)
    base = image["ARG"]["RAY_IMAGE"]
    assert image["FROM"] == "${RAY_IMAGE}"
    ray_version = kuberay["RayCluster"]["spec"]["rayVersion"]
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray_version)}-py3\d+-cu\d+", base), base
    # the pods run as the image's user
    uid, gid = (int(x) for x in image["USER"].split(":"))
    for pod in containers(kuberay["RayCluster"]).values():
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid,
                                                                                      gid)


def test_the_dockerfile_installs_the_project_as_packaged(tmp_path):
    """The files the Dockerfile copies are enough to build warmd, whose wheel has every extra
    the install line asks for and the console script the entrypoint runs."""
    image = dockerfile()
    context = tmp_path / "context"
    for copy in image["COPY"]:
        args = [a for a in shlex.split(copy) if not a.startswith("--")]
        *sources, dest = args
        assert dest.startswith("/home/ray/warmd-src")
        rel = Path(dest.removeprefix("/home/ray/warmd-src").lstrip("/"))
        for source in sources:
            target = context / rel / (Path(source).name if dest.endswith("/") else "")
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
    [run] = image["RUN"]
    install = shlex.split(run.split("&&")[0])
    assert install[:3] == ["pip", "install", "--no-cache-dir"]
    requirement = install[3].replace("${EXTRAS}", image["ARG"]["EXTRAS"])
    path, extras = re.fullmatch(r"(/home/ray/warmd-src)\[(.+)\]", requirement).groups()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "out"),
                            str(context)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "out").glob("warmd-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        provided = set(re.findall(r"^Provides-Extra: (\S+)$", whl.read(info).decode(), re.M))
        scripts = configparser.ConfigParser()
        scripts.read_string(whl.read(info.replace("METADATA", "entry_points.txt")).decode())
    assert set(extras.split(",")) <= provided
    assert "cluster" in extras.split(",")  # the node agent: Ray, Prometheus, watchdog
    assert "warmd/examples/warmd.yaml" in names  # the package data came along
    [entrypoint] = image["ENTRYPOINT"]
    assert entrypoint in scripts["console_scripts"]
    assert scripts["console_scripts"][entrypoint] == "warmd.cli:main"


def test_secrets_are_readable_by_the_pods_user_and_no_other(kuberay):
    """Mounted 0440 with the group the pod runs as (fsGroup): Ray's non-root user reads the
    key; the default 0644 would let anyone in the container read it, and 0400 (root's, as
    the kubelet writes it) nobody but root."""
    statefulset = next(d for d in kuberay_objects() if d["kind"] == "StatefulSet")
    pods = [statefulset["spec"]["template"]["spec"],
            *containers(kuberay["RayCluster"]).values()]
    for pod in pods:
        secrets = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert secrets
        for secret in secrets:
            assert secret["defaultMode"] == 0o440, secret
        context = pod["securityContext"]
        assert context["runAsUser"] != 0 and context["fsGroup"] == context["runAsGroup"]
