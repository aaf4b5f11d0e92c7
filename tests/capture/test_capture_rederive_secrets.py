"""A re-deriving producer keeps its signing key to itself: a FlashInfer capture cannot make
it embed the key in what it builds and publishes, and neither a rebuild step nor a warmup
worker's compile sees the key in its environment or files.

Real parts: a real redis-server and a real FlashInfer sm_90a module build of the attacker's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from capture_support import PLAN, isolate_rederive, opener, published_values, scope
from store_support import module_server

from warmd.context import NodeContext
from warmd.rederive import Rederiver
from warmd.targets import preset

pytest.importorskip("triton")

server = module_server()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_rederive(monkeypatch, tmp_path, server)


SECRET = b"SIGNING-KEY-0123456789abcdef"
_CRAFT = """
import os, sys
from pathlib import Path
from warmd.libraries.flashinfer.executor import worker_env
os.environ.update(worker_env("9.0a", Path(sys.argv[1])))
from flashinfer.jit import env as jit_env, gen_act_and_mul_module
from flashinfer.jit.core import gen_jit_spec
if sys.argv[2] == "gelu_tanh_and_mul":
    spec = gen_act_and_mul_module("gelu_tanh")
else:
    source = jit_env.FLASHINFER_GEN_SRC_DIR / f"{sys.argv[2]}.cu"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(sys.argv[3])
    spec = gen_jit_spec(sys.argv[2], [source])
spec.write_ninja()
print(jit_env.FLASHINFER_WORKSPACE_DIR)
"""


def planted_module(tmp_path: Path, name: str, code: str) -> bytes:
    """A FlashInfer capture as an attacker makes it with FlashInfer itself: the module's
    generated sources and the build.ninja FlashInfer writes for them (so that ae15aac's
    check of the build file passed), code of the attacker's in a source, stand-in outputs."""
    import subprocess
    import sys

    from store_support import SRC

    from warmd.cache.packing import pack_directory

    base = tmp_path / "attacker"
    done = subprocess.run([sys.executable, "-c", _CRAFT, str(base), name, code], cwd=SRC,
                          check=True, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": SRC})
    ws = Path(done.stdout.strip().splitlines()[-1])
    art = tmp_path / "artifact"
    shutil.copytree(ws / "generated", art / "generated")
    for source in (art / "generated").rglob(f"{name}.cu"):
        source.write_text(source.read_text() + code)
    (art / "module").mkdir()
    shutil.copy(ws / "cached_ops" / name / "build.ninja", art / "module" / "build.ninja")
    (art / "module" / ".ninja_log").write_text("# ninja log v6\n")
    (art / "module" / ".ninja_deps").write_bytes(b"")
    (art / "module" / f"{name}.so").write_bytes(b"\x7fELF stand-in")
    return pack_directory(art)


def submit(server, base: Path, name: str, artifact: bytes) -> None:
    from warmd.capture.scope import adapters_for

    adapter = adapters_for(scope(base))["flashinfer"]
    with opener(server, "node-a")(preset("h200")) as shared:
        assert shared.captures.submit(adapter, [PLAN], name, artifact)


@pytest.mark.parametrize("name", ["gelu_tanh_and_mul", "warmd_exfil_module"])
def test_a_flashinfer_capture_cannot_make_the_producer_embed_its_signing_key(
        server, tmp_path, monkeypatch, name):
    """A capture whose generated source holds an assembler ``.incbin`` of the producer's
    signing-key file: for a module FlashInfer makes (its sources are not the library's:
    quarantined before anything is built), and for a module of the attacker's own naming
    (no FlashInfer generator makes it: refused). ae15aac built both from the capture's
    sources and published the key inside a signed module."""
    key_file = tmp_path / "secrets" / "signing.key"
    key_file.parent.mkdir()
    key_file.write_bytes(SECRET)
    monkeypatch.setenv("WARMD_SIGNING_KEY_FILE", str(key_file))
    code = (f'\nasm(".pushsection .rodata\\n.incbin \\"{key_file}\\"\\n.popsection");\n'
            "extern \"C\" int warmd_planted() { return 1; }\n")
    submit(server, tmp_path / "a", name, planted_module(tmp_path, name, code))
    counts: list[tuple[str, str, int]] = []
    producer = Rederiver([scope(tmp_path / "b")], opener(server, "node-b"), NodeContext.of(),
                         on_count=lambda *c: counts.append(c))
    (result,) = producer.run_once()
    expected = "quarantined" if name == "gelu_tanh_and_mul" else "refused"
    assert (result.name, result.outcome) == (name, expected), result
    counter = "rederive_quarantined" if expected == "quarantined" else "rederive_refused"
    assert counts == [(counter, "flashinfer", 1)]
    assert not server.client().keys("warmd:v1:claim*")  # dropped: not tried again
    assert not any(SECRET in value for value in published_values(server))
    assert not list(server.client().scan_iter(match="warmd:v1:man:*"))  # nothing published


def test_a_rebuild_step_sees_no_secret_in_its_environment_or_files(tmp_path, monkeypatch):
    """What every re-derivation compile runs through (run_rebuild), in a producer holding
    the key inline and in a file, and the store's URL with its password: the compile's
    environment holds none of them (ae15aac passed its whole environment on); where
    bubblewrap can sandbox it, the key's file cannot be read and nothing outside its
    scratch, a private directory, is written."""
    import stat
    import sys

    from warmd.cache.rederived import RederiveRefused, run_rebuild

    key_file = tmp_path / "signing.key"
    key_file.write_bytes(SECRET)
    monkeypatch.setenv("WARMD_SIGNING_KEY_FILE", str(key_file))
    monkeypatch.setenv("WARMD_SIGNING_KEY", SECRET.decode())
    monkeypatch.setenv("WARMD_REDIS_URL", "redis://:pw@127.0.0.1:1/0")
    probe = ("import os, sys\n"
             "sys.exit(1 if any(k.startswith(('WARMD_SIGNING', 'WARMD_REDIS')) "
             f"or {SECRET.decode()!r} in v for k, v in os.environ.items()) else 0)\n")
    (tmp_path / "work").mkdir()
    run_rebuild([sys.executable, "-c", probe], env=dict(os.environ),
                cwd=str(tmp_path / "work"))

    from warmd.cache.rederived import bwrap, private_dir

    scratch = private_dir("warmd-test-", tmp_path)
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
    if bwrap() is None:
        pytest.skip("no usable bubblewrap here: the key file is not hidden")
    read = ("import sys\ntry:\n    data = open(sys.argv[1], 'rb').read()\n"
            "except OSError:\n    data = b''\nsys.exit(1 if data else 0)\n")
    run_rebuild([sys.executable, "-c", read, str(key_file)], env=dict(os.environ),
                cwd=str(scratch))
    with pytest.raises(RederiveRefused):  # the scratch is writable, the rest is not
        run_rebuild(["touch", str(tmp_path / "outside")], env=dict(os.environ),
                    cwd=str(scratch))


def test_a_warmup_workers_compiles_inherit_no_secret(tmp_path):
    """A real warmup worker process, started from a process holding the signing key and
    the store's URL: what it starts (nvcc, ninja: here a stand-in child) gets neither."""
    from warmd.executors.pool import Worker
    from warmd.tasks import Task

    out = tmp_path / "child-env.json"
    secrets = {"WARMD_SIGNING_KEY": SECRET.decode(), "WARMD_SIGNING_KEY_FILE": "/k",
               "WARMD_REDIS_URL": "redis://:pw@127.0.0.1:1/0"}
    worker = Worker({**secrets, "PYTHONPATH": os.pathsep.join(sys.path)},
                    {"flashinfer": "tests.env_executor:EnvExecutor"})
    try:
        result = worker.run(Task(key="env/probe", library="flashinfer", kernel=str(out)))
    finally:
        worker.stop()
    assert result.ok, result.error
    env = json.loads(out.read_text())
    assert not set(secrets) & set(env)
    assert not any(SECRET.decode() in value for value in env.values())
    assert "PATH" in env
