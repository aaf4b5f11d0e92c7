"""Blobs in chunks: how a blob is cut (CHUNK_SIZE), how many chunks and of which length
its manifest says it has, how blobs are batched by size, and a blob joined and verified
against its manifest (length, SHA-256)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from warmd.store.layout import sha256
from warmd.store.validation import BadRecord

if TYPE_CHECKING:
    from warmd.store.formats import Manifest

CHUNK_SIZE = 1 << 20
T = TypeVar("T")


def chunk_count(size: int, chunk_size: int = CHUNK_SIZE) -> int:
    return max(1, -(-size // chunk_size))


def size_batches(items: list[T], limit: int = 64 << 20,
                 size: Callable[[T], int] = lambda item: item[0].size) -> Iterator[list[T]]:
    """Items in order, in batches whose sizes add up to at most limit bytes (or one item
    larger than that on its own); by default (Manifest, ...) tuples, sized by their blob."""
    batch: list[T] = []
    total = 0
    for item in items:
        if batch and total + size(item) > limit:
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size(item)
    if batch:
        yield batch


def split_chunks(blob: bytes, chunk_size: int = CHUNK_SIZE) -> list[bytes]:
    return [blob[i:i + chunk_size] for i in range(0, max(len(blob), 1), chunk_size)]


def chunk_lengths(man: Manifest) -> list[int]:
    """The length every chunk of man's blob must have."""
    full, last = divmod(man.size, man.chunk_size)
    if not last and full:
        return [man.chunk_size] * full
    return [man.chunk_size] * full + [last]


def check_blob(man: Manifest, chunks: list[bytes | None]) -> bytes:
    """Join a blob's chunks and verify them against the manifest; raises BadRecord. Each
    chunk's length is checked before anything is joined."""
    lengths = chunk_lengths(man)
    if len(chunks) != len(lengths):
        raise BadRecord(f"{len(chunks)} chunks where the manifest has {len(lengths)}")
    for i, (chunk, length) in enumerate(zip(chunks, lengths, strict=True)):
        if not chunk and length:
            raise BadRecord(f"missing chunk {i} of {len(chunks)}")
        if len(chunk) < length:
            raise BadRecord(f"truncated blob: chunk {i} is {len(chunk)} of {length} bytes")
        if len(chunk) > length:
            raise BadRecord(f"oversized chunk {i}: over the manifest's {length} bytes")
    return verify_blob(man, b"".join(chunks))  # type: ignore[arg-type]


def verify_blob(man: Manifest, blob: bytes) -> bytes:
    """blob if it is the one man describes (length, SHA-256); raises BadRecord."""
    if len(blob) != man.size:
        raise BadRecord(f"truncated or oversized blob: {len(blob)} of {man.size} bytes")
    if sha256(blob) != man.digest:
        raise BadRecord("blob digest mismatch")
    return blob
