"""Safe, deterministic, atomic cache artifacts (warmd.cache.packing, warmd.cache.install)."""

from __future__ import annotations

import contextlib
import gzip
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from warmd.cache.base import UnsafeArtifact
from warmd.cache.install import (
    STAGING_DIR,
    check_artifact,
    clean_staging,
    install_atomically,
    unpack_safely,
)
from warmd.cache.packing import pack_directory, pack_members
from warmd.cache.safe_fs import CacheTree


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


FILES = {"kernel.cu": b"__global__ void k() {}\n", "sub/kernel.cubin": bytes(range(256)) * 40,
         "sub/deeper/x.txt": b"x"}


def test_pack_is_deterministic_and_normalized(tmp_path):
    a = _tree(tmp_path / "a", FILES)
    b = _tree(tmp_path / "b", FILES)
    os.utime(b / "kernel.cu", (1, 1))
    os.chmod(b / "sub" / "kernel.cubin", 0o600)
    assert pack_directory(a) == pack_directory(b)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(pack_directory(a)))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0] == "kernel.cu"
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
    assert {m.mode for m in members} <= {0o644, 0o755}


def test_pack_members_matches_pack_directory(tmp_path):
    src = _tree(tmp_path / "src", FILES)
    explicit = pack_members([(rel, src / rel) for rel in FILES])
    assert check_artifact(explicit) == check_artifact(pack_directory(src))


def test_pack_refuses_symlinks(tmp_path):
    src = _tree(tmp_path / "src", FILES)
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeArtifact, match="link"):
        pack_directory(src)


def _secret(tmp_path: Path) -> Path:
    """A file of the node that no cache entry may carry (mode 0600, outside the cache)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "id_rsa"
    secret.write_bytes(b"SECRET-KEY-MATERIAL" * 1000)  # longer than any file it replaces
    secret.chmod(0o600)
    return secret


def test_a_link_anywhere_below_the_root_is_refused_not_followed(tmp_path):
    secret = _secret(tmp_path)
    root = _tree(tmp_path / "cache", FILES)
    (root / "sub" / "linked").symlink_to(secret.parent, target_is_directory=True)
    tree = CacheTree(root)
    with pytest.raises(UnsafeArtifact, match="symlink, not a directory"):
        tree.read("sub/linked/id_rsa")
    with pytest.raises(UnsafeArtifact, match="symlink"):
        tree.lstat("sub/linked/id_rsa")
    assert not tree.is_file("sub/linked/id_rsa")
    for bad in ("../outside/id_rsa", "sub/../../outside/id_rsa", "/etc/passwd", "sub//x"):
        with pytest.raises(UnsafeArtifact, match="plain relative path"):
            tree.read(bad)
    # the configured root itself is the operator's: a link there is taken as given
    (tmp_path / "configured").symlink_to(root, target_is_directory=True)
    assert CacheTree(tmp_path / "configured").read("kernel.cu").data == FILES["kernel.cu"]


def test_a_link_swapped_in_between_the_check_and_the_open_is_never_followed(
        tmp_path, monkeypatch):
    """The check-then-open race (an engine process swapping a symlink in while warmd
    packs), made deterministic: the swap happens, on the real filesystem, right after the
    packer's first look at the file. Packing opens it once, O_NOFOLLOW, and reads from
    that descriptor, so it refuses instead of reading the secret."""
    secret = _secret(tmp_path)
    src = _tree(tmp_path / "src", FILES)
    target = src / "sub" / "kernel.cubin"
    swapped = []
    real_stat, real_lstat = os.stat, os.lstat

    def swap_after(result, path):
        if not swapped and os.fsdecode(path).endswith("kernel.cubin"):
            swapped.append(path)
            staged = target.with_name("staged-link")
            staged.symlink_to(secret)
            os.replace(staged, target)
        return result

    monkeypatch.setattr(os, "stat", lambda path, *a, **kw: swap_after(
        real_stat(path, *a, **kw), path))
    monkeypatch.setattr(os, "lstat", lambda path, *a, **kw: swap_after(
        real_lstat(path, *a, **kw), path))
    with pytest.raises(UnsafeArtifact, match="symlink"):
        pack_members([("kernel.cubin", target)])
    monkeypatch.undo()
    assert swapped and target.is_symlink()  # the swap really happened mid-pack


def test_special_files_are_refused_without_being_opened(tmp_path):
    root = _tree(tmp_path / "cache", FILES)
    os.mkfifo(root / "sub" / "__grp__kernel.json")  # opening it to read would block
    done = []

    def pack() -> None:
        with pytest.raises(UnsafeArtifact, match="FIFO"):
            CacheTree(root).read("sub/__grp__kernel.json")
        with pytest.raises(UnsafeArtifact, match="FIFO"):
            pack_directory(root)
        done.append(True)

    worker = threading.Thread(target=pack, daemon=True)
    worker.start()
    worker.join(10)
    if not done:  # release a blocked reader so that the test fails rather than hangs
        with contextlib.suppress(OSError):
            os.close(os.open(root / "sub" / "__grp__kernel.json", os.O_WRONLY | os.O_NONBLOCK))
    assert done == [True]


def test_sizes_are_checked_before_reading_and_bounded_while_reading(tmp_path):
    root = _tree(tmp_path / "cache", FILES)
    with open(root / "sparse.cubin", "wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB long, nothing on disk
    with pytest.raises(UnsafeArtifact, match="1073741824 bytes"):
        CacheTree(root, budget=1 << 20).read("sparse.cubin")
    # a file whose length says nothing of what reading it gives (/proc's are 0 bytes long)
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(UnsafeArtifact, match="grew past 10 bytes"):
        CacheTree(Path("/proc/self")).read("status", limit=10)
    # one budget for a whole tree: files each within it, together over it
    tree = CacheTree(root, budget=len(FILES["sub/kernel.cubin"]) + 1)
    tree.read("sub/kernel.cubin")
    with pytest.raises(UnsafeArtifact, match="over the 1-byte limit"):
        tree.read("kernel.cu")


def test_roundtrip(tmp_path):
    src = _tree(tmp_path / "src", FILES)
    os.chmod(src / "kernel.cu", 0o755)
    root = tmp_path / "root"
    result = install_atomically(root, "kernel.sm90.abc", pack_directory(src))
    assert result.installed and result.path == root / "kernel.sm90.abc"
    assert _read_tree(result.path) == FILES
    assert os.stat(result.path / "kernel.cu").st_mode & 0o777 == 0o755
    assert list((root / STAGING_DIR).iterdir()) == []
    again = install_atomically(root, "kernel.sm90.abc", pack_directory(src))
    assert not again.installed and _read_tree(again.path) == FILES


def test_existing_entry_is_kept(tmp_path):
    root = tmp_path / "root"
    (root / "entry").mkdir(parents=True)
    (root / "entry" / "mine").write_text("theirs")
    result = install_atomically(root, "entry", pack_directory(_tree(tmp_path / "s", FILES)))
    assert not result.installed
    assert _read_tree(root / "entry") == {"mine": b"theirs"}


UNSAFE = {
    "absolute": [(_info("/tmp/evil"), b"x")],
    "dotdot": [(_info("../evil"), b"x")],
    "nested dotdot": [(_info("a/../../evil"), b"x")],
    "symlink": [(_info("link", tarfile.SYMTYPE, "/etc/passwd"), None)],
    "hardlink": [(_info("a"), b"x"), (_info("hard", tarfile.LNKTYPE, "a"), None)],
    "char device": [(_info("dev", tarfile.CHRTYPE), None)],
    "block device": [(_info("blk", tarfile.BLKTYPE), None)],
    "fifo": [(_info("fifo", tarfile.FIFOTYPE), None)],
    "duplicate": [(_info("a"), b"x"), (_info("a"), b"y")],
    "file then child": [(_info("a"), b"x"), (_info("a/b"), b"y")],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_archives_are_refused_before_writing(tmp_path, case):
    root = tmp_path / "cache" / "root"
    artifact = _tar(UNSAFE[case])
    with pytest.raises(UnsafeArtifact):
        install_atomically(root, "entry", artifact)
    assert not (root / "entry").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["root"]
    assert sorted(p.name for p in root.iterdir()) == [STAGING_DIR]
    assert list((root / STAGING_DIR).iterdir()) == []
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


def test_oversize_artifacts_are_refused(tmp_path):
    src = _tree(tmp_path / "src", {"big": os.urandom(64 * 1024)})
    artifact = pack_directory(src)
    with pytest.raises(UnsafeArtifact, match="limit"):
        install_atomically(tmp_path / "root", "e", artifact, max_bytes=len(artifact) - 1)
    # small when compressed, large when unpacked: refused while decompressing
    bomb = pack_directory(_tree(tmp_path / "bomb", {"zeros": bytes(8 * 1024 * 1024)}))
    assert len(bomb) < 64 * 1024
    with pytest.raises(UnsafeArtifact, match="more than"):
        install_atomically(tmp_path / "root", "e", bomb, max_bytes=1024 * 1024)
    assert not (tmp_path / "root" / "e").exists()


def test_oversize_limit_comes_from_settings(tmp_path, monkeypatch):
    artifact = pack_directory(_tree(tmp_path / "src", {"big": os.urandom(10_000)}))
    monkeypatch.setenv("WARMD_MAX_ARTIFACT_BYTES", "5000")
    with pytest.raises(UnsafeArtifact):
        check_artifact(artifact)


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _with_checksum(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _pax_sparse_tar(real_size: int) -> bytes:
    """A PAX 1.0 sparse member: one real byte at offset 0 of a file declared real_size."""
    payload = b"1\n0\n1\n".ljust(512, b"\0") + b"A"
    info = tarfile.TarInfo("GNUSparseFile.0/kernel.cubin")
    info.size = len(payload)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": "kernel.cubin",
                        "GNU.sparse.realsize": str(real_size)}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(payload))
    return raw.getvalue()


def _gnu_sparse_tar(real_size: int) -> bytes:
    """An old GNU sparse member (type 'S'): 512 stored bytes of a file declared real_size."""
    info = tarfile.TarInfo("kernel.cubin")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 512
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[386:398], header[398:410] = _octal(0, 12), _octal(512, 12)  # one map entry
    header[483:495] = _octal(real_size, 12)  # realsize
    return _with_checksum(header) + b"A" * 512 + b"\0" * 1024


@pytest.mark.parametrize("make", [_pax_sparse_tar, _gnu_sparse_tar], ids=["pax", "gnu"])
def test_sparse_members_are_refused_before_writing(tmp_path, make):
    raw = make(1 << 30)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:  # control: tarfile sees a sparse file
        (member,) = tar.getmembers()
    assert member.issparse() and member.isreg() and member.size == 1 << 30
    artifact = gzip.compress(raw, mtime=0)
    assert len(artifact) < 1024
    with pytest.raises(UnsafeArtifact, match="sparse"):
        check_artifact(artifact, 1 << 20)
    with pytest.raises(UnsafeArtifact, match="sparse"):
        unpack_safely(artifact, tmp_path / "dest", 1 << 20)
    assert not (tmp_path / "dest").exists()
    root = tmp_path / "root"
    with pytest.raises(UnsafeArtifact, match="sparse"):
        install_atomically(root, "entry", artifact, max_bytes=1 << 20)
    assert sorted(p.name for p in root.iterdir()) == [STAGING_DIR]
    assert list((root / STAGING_DIR).iterdir()) == []


def test_declared_member_sizes_over_the_limit_are_refused(tmp_path):
    # a header declaring 10 MiB followed by one block: the declared sizes are what counts
    info = tarfile.TarInfo("big")
    info.size = 10 << 20
    artifact = gzip.compress(info.tobuf(tarfile.GNU_FORMAT) + b"A" * 512, mtime=0)
    with pytest.raises(UnsafeArtifact, match="add up to more than"):
        check_artifact(artifact, 1 << 20)
    with pytest.raises(UnsafeArtifact, match="add up to more than"):
        unpack_safely(artifact, tmp_path / "dest", 1 << 20)
    assert not (tmp_path / "dest").exists()


def test_garbage_and_truncated_artifacts_are_refused(tmp_path):
    good = pack_directory(_tree(tmp_path / "src", FILES))
    for bad in (b"not a tarball", good[: len(good) // 2], gzip.compress(b"x" * 1000)):
        with pytest.raises(UnsafeArtifact):
            unpack_safely(bad, tmp_path / f"dest{len(bad)}")


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "..", "a\x00b"])
def test_bad_entry_names_are_refused(tmp_path, name):
    with pytest.raises(UnsafeArtifact):
        install_atomically(tmp_path / "root", name, pack_directory(_tree(tmp_path / "s", FILES)))


def test_unpack_needs_an_empty_destination(tmp_path):
    dest = _tree(tmp_path / "dest", {"old": b"1"})
    with pytest.raises(FileExistsError):
        unpack_safely(pack_directory(_tree(tmp_path / "s", FILES)), dest)


def test_clean_staging_removes_only_dead_installers(tmp_path):
    root = tmp_path / "root"
    staging = root / STAGING_DIR
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    host = socket.gethostname()
    (staging / f"{host}+{dead.pid}+abc").mkdir(parents=True)
    (staging / f"{host}+{os.getppid()}+def").mkdir()
    removed = clean_staging(root)
    assert [p.name for p in removed] == [f"{host}+{dead.pid}+abc"]
    assert [p.name for p in staging.iterdir()] == [f"{host}+{os.getppid()}+def"]


_INSTALLER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from warmd.cache.install import install_atomically

    def pause(staged):  # staged tree complete, not yet renamed into place
        print("staged", flush=True)
        time.sleep(float(sys.argv[3]))

    artifact = Path(sys.argv[1]).read_bytes()
    hook = pause if float(sys.argv[3]) > 0 else None
    result = install_atomically(Path(sys.argv[2]), "entry", artifact, prepare=hook)
    print("installed" if result.installed else "kept", flush=True)
""")


def _big_tree(tmp_path: Path) -> tuple[dict[str, bytes], Path]:
    files = {f"d{i % 7}/f{i:03d}": os.urandom(64 * 1024) for i in range(120)}
    src = _tree(tmp_path / "big", files)
    artifact = tmp_path / "big.tgz"
    artifact.write_bytes(pack_directory(src))
    return files, artifact


def _installer(artifact: Path, root: Path, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _INSTALLER, str(artifact), str(root),
                             str(pause)], stdout=subprocess.PIPE, text=True)


def _reinstall_and_check(root: Path, artifact: Path, files: dict[str, bytes]) -> None:
    result = install_atomically(root, "entry", artifact.read_bytes())
    assert _read_tree(result.path) == files
    assert list((root / STAGING_DIR).iterdir()) == []


def test_installer_killed_before_rename_leaves_no_entry(tmp_path):
    files, artifact = _big_tree(tmp_path)
    root = tmp_path / "root"
    proc = _installer(artifact, root, pause=30)
    assert proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (root / "entry").exists()
    assert len(list((root / STAGING_DIR).iterdir())) == 1  # the killed run's leftovers
    _reinstall_and_check(root, artifact, files)  # the next run cleans them up


def test_installer_killed_at_any_time_leaves_nothing_or_everything(tmp_path):
    files, artifact = _big_tree(tmp_path)
    for i, delay in enumerate((0.05, 0.1, 0.12, 0.15, 0.2, 0.3)):
        root = tmp_path / f"root{i}"
        proc = _installer(artifact, root, pause=0)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (root / "entry").exists():
            assert _read_tree(root / "entry") == files, "a half-written entry is visible"
        _reinstall_and_check(root, artifact, files)


def _install_after_barrier(barrier, artifact: str, root: str, out) -> None:
    barrier.wait()
    result = install_atomically(Path(root), "entry", Path(artifact).read_bytes())
    out.put(result.installed)


def test_concurrent_installers_agree_on_one_entry(tmp_path):
    files, artifact = _big_tree(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    root = tmp_path / "root"
    procs = [ctx.Process(target=_install_after_barrier, args=(barrier, str(artifact),
                                                               str(root), out))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [out.get(timeout=5) for _ in procs]
    assert results.count(True) == 1
    assert _read_tree(root / "entry") == files
    assert sorted(p.name for p in root.iterdir()) == [STAGING_DIR, "entry"]
    assert list((root / STAGING_DIR).iterdir()) == []
