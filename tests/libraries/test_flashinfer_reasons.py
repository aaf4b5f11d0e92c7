"""FlashInfer's task reasons never carry what its tools quote: a real ninja (through
FlashInfer's own run_ninja) and a real gcc fail on a build that reads a node's file, and the
reason names where they failed, not what they read. The executor reads a module's
.ninja_log through CacheTree: a planted FIFO or link is neither opened nor followed."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from warmd.libraries.flashinfer.executor import FlashInferExecutor, _short_reason

pytestmark = pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("gcc") is None,
                                reason="needs ninja and gcc")


def ninja_failure(workdir: Path, build_ninja: str) -> RuntimeError:
    """What FlashInfer's JIT raises when ninja fails on this build.ninja."""
    from flashinfer.jit.cpp_ext import run_ninja

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "build.ninja").write_text(build_ninja)
    with pytest.raises(RuntimeError) as failed:
        run_ninja(workdir, workdir / "build.ninja", verbose=False)
    return failed.value


def node_file(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "secret"
    path.write_text(content)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("content", [
    "root:x:0:0:hunter2:/root:/bin/bash\n",  # ninja shows the line after its error
    "build out: hunter2 in\n",  # ninja's error itself names the token: unknown rule
])
def test_a_build_ninja_including_a_node_file_fails_without_echoing_it(tmp_path, content):
    secret = node_file(tmp_path, content)
    failure = ninja_failure(tmp_path / "module", f"include {secret}\n")
    assert "hunter2" in str(failure)  # ninja quotes what it read...
    reason = _short_reason(failure)
    assert "hunter2" not in reason  # ...the reason never
    assert f"errors at {secret}:1" in reason and reason.startswith("RuntimeError: Ninja build")


def test_a_compile_error_quoting_a_node_file_names_only_where(tmp_path):
    secret = node_file(tmp_path, "hunter2 value;\n")  # gcc: unknown type name 'hunter2'
    module = tmp_path / "module"
    module.mkdir()
    (module / "op.c").write_text(f'#include "{secret}"\nint f(void) {{ return 0; }}\n')
    failure = ninja_failure(module, "rule cc\n  command = gcc -c $in -o $out\n"
                                    f"build {module}/op.o: cc {module}/op.c\n")
    assert "hunter2" in str(failure)
    reason = _short_reason(failure)
    assert "hunter2" not in reason
    assert "failed: op.o" in reason and f"errors at {secret}:1" in reason


def test_one_line_reasons_are_kept():
    assert _short_reason(ImportError("No module named 'flashinfer'")) == \
        "ImportError: No module named 'flashinfer'"


def _read_in_time(executor: FlashInferExecutor, module: str) -> dict:
    found: list[dict] = []
    reader = threading.Thread(target=lambda: found.append(executor.ninja_log(module)),
                              daemon=True)
    reader.start()
    reader.join(10)
    assert found, "reading the ninja log blocked"
    return found[0]


def test_the_ninja_log_is_read_without_links_or_fifos(tmp_path):
    executor = FlashInferExecutor(tmp_path / "ws", arch="9.0a")
    root = executor.cache().root
    log_text = "# ninja log v7\n1\t2\t3\tout.o\tabc\n"
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_text(log_text)
    for name, plant in (("fifo", lambda p: os.mkfifo(p)),
                        ("link", lambda p: os.symlink(elsewhere, p))):
        (root / name).mkdir(parents=True)
        plant(root / name / ".ninja_log")
        assert _read_in_time(executor, name) == {}
    (root / "linked").symlink_to(root / "link")  # a linked module directory: not followed
    assert _read_in_time(executor, "linked") == {}
    (root / "plain").mkdir()
    (root / "plain" / ".ninja_log").write_text(log_text)
    assert list(_read_in_time(executor, "plain")) == ["out.o"]
    assert _read_in_time(executor, "absent") == {}
