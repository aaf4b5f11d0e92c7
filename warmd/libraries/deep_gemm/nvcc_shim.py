"""The compiler DeepGEMM runs during a warmup (its ``DG_JIT_NVCC_COMPILER``), so that each
distinct kernel is compiled once per node, by whoever claims it first.

DeepGEMM names a kernel's cache entry from a digest of what it compiles and runs nvcc from
a shell, in one of two forms (install.py: its generation):

    cd <scratch> && <compiler> <tmp>/<uuid>/kernel.cu -cubin -o <cubin> <flags>
        sgl-deep-gemm 0.1.x, DeepGEMM 2.6 (csrc/jit/compiler.hpp)
    cd <tmp>/<uuid> && <compiler> <tmp>/<uuid>/kernel.cu --cubin --output-file <cubin>
        <flags> --include-path <dir>...     DeepGEMM 2.8 (DeepJIT's cuda/backend.hpp)

then renames the build directory to that entry. Both take the compiler's identity from
``<compiler> --version`` only (the NVCC release; DeepJIT hashes the whole output), and the
flags never name the compiler, so a shim that answers ``--version`` with the real nvcc's
words leaves every key unchanged: the entries are named and laid out by DeepGEMM itself,
exactly as without the shim.

Each compile request is a *job*, ``<run>/jobs/<key>/`` (key: sha256 of the arguments, with
the source and output paths as placeholders, and of the source), holding ``kernel.cu`` and
``args.json``. Two modes:

- ``record``: save the job and answer with a placeholder cubin (one empty kernel, built
  once per arch), so that a discovery pass sees every kernel a plan's GEMMs ask for without
  compiling any; it runs with a throw-away cache root.
- ``build``: claim the job (an flock: one compile per job on the node), compile it with
  the real nvcc unless done already, and hand DeepGEMM the cubin.

warmd's parent compiles recorded jobs with ``compile_job`` meanwhile, as many at once as
it has cores. Every compile reads the source as ``kernel.cu`` in a fresh private directory
(mkdtemp, 0700) it runs in, with ``-frandom-seed=<key>``: nvcc names internal symbols from
the source's path as given and a random seed, so this makes a kernel's cubin the same bytes
whichever node (GPU node, CPU builder or trusted producer) compiles it. Neither changes
DeepGEMM's key: DeepGEMM hashes its own arguments before calling the compiler.

Every real nvcc run appends a line to ``<run>/compiles.log``; a call that
names a ``.cu`` file in a form the shim does not know goes to nvcc as is and is noted in
``<run>/passthrough.log`` (the kernel stage then knows its fast path is not running).

Run by path (``python3 nvcc_shim.py MODE RUN NVCC ARGS...``), it imports nothing of
warmd: DeepGEMM starts it once per kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

RECORD, BUILD = "record", "build"
SOURCE, OUTPUT = "{source}", "{output}"
PLACEHOLDER_SOURCE = 'extern "C" __global__ void warmd_discovery_placeholder() {}\n'


class Job:
    """One compile request: a kernel source and the nvcc arguments DeepGEMM gave it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def source(self) -> Path:
        return self.path / "kernel.cu"

    @property
    def cubin(self) -> Path:
        return self.path / "kernel.cubin"

    @property
    def args_file(self) -> Path:
        """The nvcc arguments, written last: its mtime is when the request was complete."""
        return self.path / "args.json"

    @property
    def ready(self) -> bool:
        """Whether the request is fully written (args.json goes in last)."""
        return self.args_file.is_file()

    def args(self) -> list[str]:
        return json.loads(self.args_file.read_text())

    def failure(self) -> str | None:
        """nvcc's output when it failed on this job (then it is not tried again)."""
        with contextlib.suppress(OSError):
            return (self.path / "failed").read_text()
        return None


CUBIN_FLAGS, OUTPUT_FLAGS, PTX_FLAGS = ("-cubin", "--cubin"), ("-o", "--output-file"), \
    ("-ptx", "--ptx")
ARCH_FLAGS = ("--gpu-architecture", "-arch")
PASSTHROUGH_LOG = "passthrough.log"


def parse_compile(args: list[str]) -> tuple[str, str, list[str]] | None:
    """(source, output, argument template) of a ``<src>.cu -cubin -o <out> <flags>`` or
    ``<src>.cu --cubin --output-file <out> <flags>`` call; None for anything else
    (``--version``, PTX dumps...), which goes to nvcc as is."""
    if not any(f in args for f in CUBIN_FLAGS) or any(f in args for f in PTX_FLAGS):
        return None
    outputs = [i + 1 for i, a in enumerate(args) if a in OUTPUT_FLAGS]
    if len(outputs) != 1 or outputs[0] >= len(args):
        return None
    out_at = outputs[0]
    sources = [i for i, a in enumerate(args) if a.endswith(".cu") and i != out_at]
    if len(sources) != 1:
        return None
    template = list(args)
    template[sources[0]], template[out_at] = SOURCE, OUTPUT
    return args[sources[0]], args[out_at], template


def job_key(template: list[str], source: bytes) -> str:
    digest = hashlib.sha256(json.dumps(template).encode() + b"\0" + source)
    return digest.hexdigest()[:32]


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_job(run: Path, template: list[str], source: bytes, key: str | None = None) -> Job:
    """The job for this request, written once (concurrent savers write the same bytes);
    key: the one a kernel list gave it (its template may name this node's include paths)."""
    job = Job(run / "jobs" / (key or job_key(template, source)))
    if job.ready:
        return job
    job.path.mkdir(parents=True, exist_ok=True)
    _write_atomically(job.source, source)
    _write_atomically(job.args_file, json.dumps(template).encode())
    return job


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True):
    """Hold the lock file's flock; without wait, yield False at once when it is taken."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def compile_job(run: Path, job: Job, nvcc: str,
                started: Callable[[subprocess.Popen], None] | None = None,
                wait: bool = True, timeout: float | None = None) -> str | None:
    """Compile the job unless it is compiled (or failed) already; None when its cubin is
    there (or, without wait, someone else is compiling it), else nvcc's output (or why it
    was killed: still running after timeout seconds). Holding the job's lock while
    compiling makes everyone else who needs it wait for this compile instead of running
    their own."""
    with _locked(job.path / "lock", wait) as mine:
        if not mine:
            return None
        if job.cubin.is_file():
            return None
        failed = job.failure()
        if failed is not None:
            return failed
        with _slot(run):
            return _compile(run, job, nvcc, started, timeout)


def _compile(run: Path, job: Job, nvcc: str,
             started: Callable[[subprocess.Popen], None] | None,
             timeout: float | None = None) -> str | None:
    """Run nvcc on the job (its lock and a compile slot held)."""
    partial = (job.path / f".kernel.{uuid.uuid4().hex[:8]}.cubin").resolve()
    began, wall = time.monotonic(), time.time()
    nice = compile_nice(run)
    with _private_source(job) as folder:  # nothing else there shadows a header
        command = [nvcc, *("kernel.cu" if a == SOURCE else str(partial) if a == OUTPUT
                           else a for a in job.args()), f"-frandom-seed={job.key}"]
        # nvcc's intermediate files too (a killed nvcc leaves them): removed with the folder
        scratch = folder / "tmp"
        scratch.mkdir(mode=0o700)
        # Started for a caller that stops it (``started``: warmd's kernel stage), nvcc leads
        # its own process group, so that cicc and ptxas are stopped with it; else it stays
        # in its caller's (a worker's: stopped with the worker).
        proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "TMPDIR": str(scratch)},
                                start_new_session=started is not None,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        if started is not None:
            started(proc)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if started is not None:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            proc.communicate()
            output = f"nvcc timed out after {timeout:g} s (killed; WARMD_TASK_TIMEOUT)"
    seconds = time.monotonic() - began
    ok = proc.returncode == 0 and partial.is_file()
    if ok:
        os.replace(partial, job.cubin)
    else:
        with contextlib.suppress(OSError):
            partial.unlink()
        _write_atomically(job.path / "failed", (output or f"exit {proc.returncode}")
                          .encode())
    _log_compile(run, job, ok, seconds, wall)
    return None if ok else (output or f"nvcc exited {proc.returncode}")


# nvcc names a kernel's internal symbols (``_INTERNAL_<hash>_...``) from the source's
# absolute path, whatever -frandom-seed says: a job compiled at the same path gives the same
# cubin on every node (measured with DeepGEMM 2.8.1's transpose kernel, nvcc 13.0).
BUILD_HOME = Path("/tmp") / f"warmd-nvcc-{os.geteuid()}"
_SAFE_KEY = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_-")


def owned_private_dir(path: Path) -> bool:
    """Whether path is (or is now made) a directory of this user's that no one else can
    enter: not a link, owned by this user, no group or other permissions."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & 0o077)


@contextlib.contextmanager
def _private_source(job: Job):
    """The job's source as ``kernel.cu`` in a directory only this user can enter (removed
    afterwards), which nvcc then runs in: /tmp/warmd-nvcc-<uid>/<job key>/, the same path on
    every node, so the same cubin, one compile of a key there at a time. When that
    directory is not this user's alone (another local user made it first), a fresh
    ``mkdtemp`` instead: still private, but its cubin then differs from other nodes'."""
    plain_key = set(job.key) <= _SAFE_KEY
    same_path = plain_key and owned_private_dir(BUILD_HOME)
    if not same_path:
        why = f"{BUILD_HOME} is not this user's alone" if plain_key else \
            f"the job key {job.key!r} is not a plain name"
        print(f"warmd nvcc shim: {why}; compiling in a fresh directory (its cubin will not "
              f"match other nodes')", file=sys.stderr)
    with _locked(BUILD_HOME / f"{job.key}.lock") if same_path else contextlib.nullcontext():
        if same_path:
            folder = BUILD_HOME / job.key
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o700)
        else:
            folder = Path(tempfile.mkdtemp(prefix="warmd-nvcc-"))
        try:
            os.chmod(folder, 0o700)
            shutil.copyfile(job.source, folder / "kernel.cu")
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _slot(run: Path):
    """One of the run's compile slots (``<run>/slots/<i>``, as many as compiles may run at
    once on the node), held while nvcc runs; no slots: no limit."""
    slots = sorted((run / "slots").glob("*")) if (run / "slots").is_dir() else []
    if not slots:
        yield
        return
    while True:
        for slot in slots:
            with _locked(slot, wait=False) as mine:
                if mine:
                    yield
                    return
        time.sleep(0.05)


def set_compile_nice(run: Path, nice: int) -> None:
    """Run this run's nvcc processes (the pool's and the workers') at this nice increment."""
    _write_atomically(run / "nice", str(max(0, int(nice))).encode())


def compile_nice(run: Path) -> int:
    try:
        return max(0, int((run / "nice").read_text()))
    except (OSError, ValueError):
        return 0


def make_slots(run: Path, count: int) -> None:
    """Allow count compiles at once in this run, whoever runs them."""
    (run / "slots").mkdir(parents=True, exist_ok=True)
    for index in range(max(1, count)):
        (run / "slots" / str(index)).touch()


def _log_compile(run: Path, job: Job, ok: bool, seconds: float, began: float) -> None:
    line = json.dumps({"key": job.key, "ok": ok, "seconds": round(seconds, 3),
                       "began": round(began, 3),
                       "source_sha256": hashlib.sha256(job.source.read_bytes()).hexdigest(),
                       "pid": os.getpid()}) + "\n"
    fd = os.open(run / "compiles.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line: atomic with O_APPEND
    finally:
        os.close(fd)


def note_passthrough(run: Path, args: list[str]) -> None:
    fd = os.open(run / PASSTHROUGH_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(args) + "\n").encode())
    finally:
        os.close(fd)


def read_passthrough(run: Path) -> list[list[str]]:
    """The compile calls this run's shims sent to nvcc untouched."""
    try:
        lines = (run / PASSTHROUGH_LOG).read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def read_compiles(run: Path) -> list[dict]:
    """Every real nvcc run of this warmup (the shim's and the parent's)."""
    try:
        lines = (run / "compiles.log").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def job_arch(template: list[str]) -> str:
    """The ``sm_XX`` a job compiles for (``--gpu-architecture=sm_90a``, ``-arch sm_90a``...;
    the last one given wins, as with nvcc)."""
    found = "sm_90a"
    for i, arg in enumerate(template):
        name, eq, value = arg.partition("=")
        if name in ARCH_FLAGS:
            found = value if eq else (template[i + 1] if i + 1 < len(template) else found)
    return found


def placeholder_cubin(run: Path, nvcc: str, template: list[str]) -> Path:
    """A cubin holding one empty kernel for the job's arch, built once per run."""
    return build_placeholder(run, nvcc, job_arch(template))


def build_placeholder(run: Path, nvcc: str, arch: str) -> Path:
    """The placeholder cubin for ``sm_XX`` (one kernel, no parameters: DeepGEMM loads a
    cubin's only kernel), built unless it is there."""
    cubin = run / f"placeholder-{arch}.cubin"
    with _locked(run / "placeholder.lock"):
        if not cubin.is_file():
            source = run / "placeholder.cu"
            source.write_text(PLACEHOLDER_SOURCE)
            partial = cubin.with_name(f".{cubin.name}.partial")
            subprocess.run([nvcc, str(source), "-cubin", "-o", str(partial),
                            f"--gpu-architecture={arch}"],
                           cwd=run, check=True, capture_output=True, text=True)
            os.replace(partial, cubin)
    return cubin


def main(argv: list[str]) -> int:
    mode, run, nvcc, args = argv[0], Path(argv[1]), argv[2], argv[3:]
    parsed = parse_compile(args)
    if parsed is None:
        if any(a.endswith(".cu") for a in args):  # a compile the shim cannot take apart
            note_passthrough(run, args)
        os.execv(nvcc, [nvcc, *args])
    source, output, template = parsed
    job = save_job(run, template, Path(source).read_bytes())
    if mode == RECORD:
        shutil.copyfile(placeholder_cubin(run, nvcc, template), output)
        return 0
    failure = compile_job(run, job, nvcc)
    if failure is not None:
        sys.stdout.write(failure)  # DeepGEMM prints it with "NVCC compilation failed"
        return 1
    shutil.copyfile(job.cubin, output)
    return 0


def write_shim(run: Path, mode: str, nvcc: str) -> Path:
    """An executable DeepGEMM can be given as DG_JIT_NVCC_COMPILER for this run and mode."""
    import shlex

    script = run / f"nvcc-{mode}"
    words = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), mode, str(run), nvcc]
    script.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words)
                      + ' "$@"\n')
    script.chmod(0o755)
    return script


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
