"""deploy/: every manifest validates offline (Kubernetes' own schemas, KubeRay's RayCluster
CRD), has what its system requires, references only what the repo creates, and every warmd
command in it exists in the CLI with those flags; the image's Dockerfile installs the project
as packaged; the Redis ACL users (shipped, and as deploy/kuberay/secrets.sh generates them)
load into a real redis-server and get exactly the rights they are documented to have."""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd import settings
from warmd.cli import main
from warmd.cluster.state import NodeState, node_records
from warmd.config.parse import parse_config
from warmd.store import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SETTINGS = (ROOT / "warmd" / "knobs.py").read_text()
_SEPARATORS = {";", "&&", "||", "|", "&", "then", "do", "else", "fi", "done", "(", ")"}


def warmd_commands(text: str) -> list[list[str]]:
    """Every `warmd ...` invocation in a shell snippet, as tokens up to the next operator."""
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if Path(token).name == "warmd":
                cmd = []
                for t in tokens[i:]:
                    if t in _SEPARATORS:
                        break
                    cmd.append(t)
                found.append(cmd)
    return found


def check_cli(tokens: list[str]) -> None:
    """The subcommand exists and each --flag is one of its options (per click's tree); what
    follows `--` is the engine's serve command (warmd's parser reads it: see the tests of
    verify below)."""
    assert len(tokens) >= 2, tokens
    command = main.commands.get(tokens[1])
    assert command is not None, f"no `warmd {tokens[1]}` subcommand"
    options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
    if "--" in tokens:
        tokens = tokens[:tokens.index("--")]
    for token in tokens[2:]:
        if token.startswith("-"):
            assert token.split("=", 1)[0] in options, f"`warmd {tokens[1]}` has no {token}"


def warmd_env_names(text: str) -> set[str]:
    return set(re.findall(r"\bWARMD_[A-Z_]+\b", text))


# --- KubeRay ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kuberay():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "raycluster.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def generated_secrets() -> list[dict]:
    """What `bash deploy/kuberay/secrets.sh | kubectl create -f -` creates."""
    out = subprocess.run(["bash", str(DEPLOY / "kuberay" / "secrets.sh")], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return list(yaml.safe_load_all(out))


def kuberay_objects() -> list[dict]:
    """Every object the deploy section of docs/daemon.md has you create, in its order."""
    docs = []
    for name in ("redis.yaml", "models-pvc.yaml", "raycluster.yaml"):
        docs += [d for d in yaml.safe_load_all((DEPLOY / "kuberay" / name).read_text()) if d]
    return docs + generated_secrets()


def containers(cluster: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    out = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]["spec"]
    return out


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


# --- Redis on Kubernetes ---------------------------------------------------------------------

def redis_directives(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines()
                if line.strip() and not line.startswith("#"))


def test_the_redis_statefulset_serves_what_the_secrets_point_at():
    made = {(d["kind"], d["metadata"]["name"]): d for d in kuberay_objects()}
    shipped = (DEPLOY / "redis" / "redis.conf").read_text()
    assert made["ConfigMap", "warmd-redis-conf"]["data"]["redis.conf"] == shipped
    conf = redis_directives(shipped)
    statefulset = made["StatefulSet", "redis"]
    pod = statefulset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert container["command"] == ["redis-server", f"{mounts['conf']}/redis.conf"]
    [item] = volumes["acl"]["secret"]["items"]
    assert f"{mounts['acl']}/{item['path']}" == conf["aclfile"]
    assert mounts["data"] == conf["dir"]
    assert [t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]] == [
        "data"]
    assert container["ports"][0]["containerPort"] == int(conf["port"])
    maxmemory = int(conf["maxmemory"].removesuffix("gb")) * 2**30
    limit = container["resources"]["limits"]["memory"]
    assert int(limit.removesuffix("Gi")) * 2**30 > maxmemory
    service = made["Service", statefulset["spec"]["serviceName"]]
    assert service["spec"]["selector"] == pod.get("metadata", statefulset["spec"]["template"][
        "metadata"])["labels"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:" \
           f"{service['spec']['ports'][0]['port']}"
    for name in ("warmd-redis", "warmd-redis-reader"):
        assert f"@{host}/0" in made["Secret", name]["stringData"]["url"]


def _local(url: str, port: int) -> str:
    return re.sub(r"@[^/]+/", f"@127.0.0.1:{port}/", url)


def test_generated_secrets_log_in_to_the_shipped_redis(tmp_path, monkeypatch):
    """secrets.sh's ACL file (hashes only) loaded by a real redis-server with the shipped
    redis.conf; warmd's URLs log in with their user's rights; the key signs."""
    first, second = generated_secrets(), generated_secrets()
    secrets = {d["metadata"]["name"]: d["stringData"] for d in first}
    assert all(a["stringData"] != b["stringData"] for a, b in zip(first, second, strict=True))
    writer_url, reader_url = secrets["warmd-redis"]["url"], secrets["warmd-redis-reader"]["url"]
    acl = secrets["warmd-redis-acl"]["users.acl"]
    for url in (writer_url, reader_url):
        assert url.split(":")[2].split("@")[0] not in acl  # the ACL holds hashes only
    with redis_with_deploy_config(tmp_path, acl) as port:
        writer = node_records(_local(writer_url, port), "k8s")
        assert writer.put(NodeState("n1")), writer.last_error
        reader = node_records(_local(reader_url, port), "k8s")
        assert not reader.put(NodeState("n2")) and "no permissions" in reader.last_error
        assert [r.node_id for r in reader.get_all()] == ["n1"]
        with pytest.raises(redis.exceptions.AuthenticationError):
            client(port, username="warmd-writer", password="wrong").ping()
    key_file = tmp_path / "key"
    key_file.write_text(secrets["warmd-signing-key"]["key"])
    monkeypatch.setenv("WARMD_SIGNING_KEY_FILE", str(key_file))
    assert re.fullmatch(rb"[0-9a-f]{64}", settings.signing_key())


# --- systemd ---------------------------------------------------------------------------------

def systemd_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / name).read_text())
    return unit


def test_systemd_unit():
    unit = systemd_unit("warmd.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["Type"] == "oneshot" and service["RemainAfterExit"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert unit["Unit"]["Description"]
    for key in ("ExecStart", "ExecStop"):
        tokens = shlex.split(service[key])
        assert Path(tokens[0]).is_absolute() and Path(tokens[0]).name == "warmd"
        check_cli(tokens)
    assert shlex.split(service["ExecStart"])[1] == "start"
    assert shlex.split(service["ExecStop"])[1] == "stop"
    for line in unit["Service"].get("Environment", "").splitlines() or [""]:
        for name in warmd_env_names(line):
            assert f'"{name}"' in SETTINGS


def test_the_units_run_the_binaries_the_documented_install_creates():
    """Each unit's comment says how to install (scripts/setup.sh into WARMD_VENV); the units
    run warmd and ray from that virtualenv's bin/, where pip puts the project's console
    script and Ray's (the cluster extra)."""
    import tomllib

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'VENV="${WARMD_VENV:-.venv}"' in setup
    assert re.search(r'PIP=\("\$VENV/bin/python" -m pip install', setup)
    assert re.search(r'"\$\{PIP\[@\]\}" -e "\.\[[^"]*cluster[^"]*\]"', setup)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["warmd"] == "warmd.cli:main"
    assert any(d.startswith("ray") for d in project["optional-dependencies"]["cluster"])
    for name in ("warmd.service", "ray-head.service"):
        text = (DEPLOY / "systemd" / name).read_text()
        venv = re.search(r"sudo WARMD_VENV=(\S+) bash scripts/setup\.sh", text).group(1)
        unit = systemd_unit(name)
        for key in ("ExecStart", "ExecStop"):
            binary = Path(shlex.split(unit["Service"][key])[0])
            assert binary.parent == Path(venv) / "bin", (name, key, binary)


def test_the_bare_metal_cache_environment_resolves_for_both_engines():
    from warmd.engines.cache_dirs import resolve

    env = dict(line.split("=", 1) for line in
               (DEPLOY / "systemd" / "cache.env").read_text().splitlines()
               if line and not line.startswith("#"))
    for engine in ("vllm", "sglang"):
        for directory in resolve(engine, env, None).directories().values():
            assert directory.is_relative_to("/var/cache/warmd"), (engine, directory)


def test_the_units_warmd_requires_are_shipped_and_run_ray_as_ray_takes_it():
    """Requires=ray-head.service: shipped beside it, running `ray start`/`ray stop` with
    flags Ray's own CLI has, in the foreground, as the same user as warmd."""
    from ray.scripts.scripts import cli as ray_cli

    warmd_unit = systemd_unit("warmd.service")
    required = warmd_unit["Unit"]["Requires"].split()
    assert required == ["ray-head.service"]
    assert "ray-head.service" in warmd_unit["Unit"]["After"].split()
    head = systemd_unit("ray-head.service")
    service = head["Service"]
    assert service["Type"] == "simple" and service["User"] == warmd_unit["Service"]["User"]
    assert head["Install"]["WantedBy"] == "multi-user.target"
    for key, subcommand in (("ExecStart", "start"), ("ExecStop", "stop")):
        tokens = shlex.split(service[key])
        assert Path(tokens[0]).is_absolute() and Path(tokens[0]).name == "ray"
        assert tokens[1] == subcommand
        command = ray_cli.commands[subcommand]
        options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
        for token in tokens[2:]:
            assert token.split("=", 1)[0] in options, f"`ray {subcommand}` has no {token}"
    start = shlex.split(service["ExecStart"])
    assert {"--head", "--block"} <= set(start)  # in the foreground: systemd supervises it
    assert "--address auto" in warmd_unit["Service"]["ExecStart"]


# --- Redis -----------------------------------------------------------------------------------

@contextlib.contextmanager
def redis_with_deploy_config(tmp_path, acl_text: str):
    """A real redis-server running deploy/redis/redis.conf, with only what must differ on a
    test machine overridden (later directives win): port, data dir, ACL file path."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    acl = tmp_path / "users.acl"
    acl.write_text(acl_text)
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text((DEPLOY / "redis" / "redis.conf").read_text()
                    + f"\nbind 127.0.0.1\nport {port}\ndir {tmp_path}\naclfile {acl}\n"
                    + "daemonize no\nappendonly no\n")
    proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            if proc.poll() is not None:
                pytest.fail(f"redis-server refused the config: {proc.stdout.read().decode()}")
            assert time.monotonic() < deadline, "redis-server did not come up"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def client(port: int, **kw) -> redis.Redis:
    """No hidden retries: redis-py would retry a refused login for seconds."""
    return redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0), **kw)


def _answers(port: int) -> bool:
    try:
        client(port).ping()
    except redis.exceptions.AuthenticationError:
        return True  # it answered: the default user is off
    except redis.exceptions.ConnectionError:
        return False
    return True


def with_passwords(text: str) -> str:
    return "".join(line + (f" >{line.split()[1]}-pw" if line.startswith("user warmd-") else "")
                   + "\n" for line in text.splitlines())


def test_redis_acl_users_have_their_documented_rights(tmp_path):
    shipped = (DEPLOY / "redis" / "users.acl").read_text()
    with redis_with_deploy_config(tmp_path, with_passwords(shipped)) as port:
        writer = client(port, username="warmd-writer", password="warmd-writer-pw")
        reader = client(port, username="warmd-reader", password="warmd-reader-pw")
        writer.set("warmd:v1:probe", b"x")
        assert writer.eval("return redis.call('GET', KEYS[1])", 1, "warmd:v1:probe") == b"x"
        writer.publish("warmd:v1:pub:{fp}:t", "done")
        writer.info("memory")
        assert reader.get("warmd:v1:probe") == b"x" and reader.info("memory")
        pubsub = reader.pubsub()
        pubsub.subscribe("warmd:v1:pub:{fp}:t")
        pubsub.close()
        for denied in (lambda: reader.set("warmd:v1:probe", b"y"),
                       lambda: reader.publish("warmd:v1:pub:x", "y"),
                       lambda: writer.set("other:key", b"y"),
                       lambda: writer.flushall(),
                       lambda: writer.config_get("*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        with pytest.raises(redis.exceptions.RedisError):  # the default user is off
            client(port).get("warmd:v1:probe")

        # warmd's own node records: the writer writes, the reader is refused and it is counted
        url = f"redis://warmd-writer:warmd-writer-pw@127.0.0.1:{port}/0"
        assert node_records(url, "acl").put(NodeState("n1"))
        read_only = node_records(f"redis://warmd-reader:warmd-reader-pw@127.0.0.1:{port}/0", "acl")
        assert not read_only.put(NodeState("n2")) and read_only.errors == 1
        assert "NOPERM" in read_only.last_error or "permission" in read_only.last_error.lower()
        assert [r.node_id for r in read_only.get_all()] == ["n1"]


def test_shipped_acl_users_cannot_log_in_until_given_a_password(tmp_path):
    with redis_with_deploy_config(tmp_path, (DEPLOY / "redis" / "users.acl").read_text()) as port:
        for user in ("warmd-writer", "warmd-reader", "default"):
            with pytest.raises(redis.exceptions.AuthenticationError):
                client(port, username=user, password="").ping()
