# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Binary deltas between builds of one library, so several builds travel to the GPU machine at once.

Builds of ggml-cuda that differ in one or two objects (stock, hooked, a table compiled in) share
almost all of their 60-70 MB, but a compressed build is about 40 MB and the machine accepts 64 MiB per
call. A delta against a base build is a few MB. rsync-style: blocks of the base are indexed by a weak
checksum; the target is scanned at every offset (vectorized with numpy), matches are verified
byte-for-byte and extended, and the rest is sent as literals. ``apply`` needs only the standard library.

Format (then lzma-compressed): magic, base sha256, target sha256, target size, then ops:
``C`` offset:u64 length:u64 (copy from base) and ``L`` length:u64 bytes (literal).
"""

from __future__ import annotations

import hashlib
import lzma
import struct
import sys
from pathlib import Path

MAGIC = b"GGMLDLT1"
BLOCK = 2048


def _weak_sums(data: bytes, block: int):  # type: ignore[no-untyped-def]
    """Weak checksum of the window starting at every offset (uint32), via prefix sums."""
    import numpy as np

    t = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    idx = np.arange(t.size, dtype=np.int64)
    p = np.concatenate(([0], np.cumsum(t)))
    q = np.concatenate(([0], np.cumsum(t * idx)))
    n = t.size - block + 1
    i = np.arange(n, dtype=np.int64)
    a = p[block : block + n] - p[:n]
    b = (block + i) * a - (q[block : block + n] - q[:n])
    return ((a & 0xFFFF) | ((b & 0xFFFF) << 16)).astype(np.uint32)


def _match_length(base: bytes, s: int, target: bytes, t: int) -> int:
    """Length of the common run base[s:] / target[t:], compared a chunk at a time."""
    n = 0
    limit = min(len(base) - s, len(target) - t)
    chunk = 1 << 16
    while n < limit:
        step = min(chunk, limit - n)
        if base[s + n : s + n + step] == target[t + n : t + n + step]:
            n += step
            continue
        lo, hi = 0, step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if base[s + n : s + n + mid] == target[t + n : t + n + mid]:
                lo = mid
            else:
                hi = mid - 1
        return n + lo
    return n


def make(base: bytes, target: bytes, block: int = BLOCK) -> bytes:
    import numpy as np

    out = bytearray(MAGIC)
    out += hashlib.sha256(base).digest() + hashlib.sha256(target).digest()
    out += struct.pack("<Q", len(target))
    if len(base) < block or len(target) < block:
        out += b"L" + struct.pack("<Q", len(target)) + target
        return lzma.compress(bytes(out), preset=6)
    base_weak = _weak_sums(base, block)[::block]
    index: dict[int, list[int]] = {}
    for k, w in enumerate(base_weak.tolist()):
        index.setdefault(w, []).append(k * block)
    target_weak = _weak_sums(target, block)
    candidates = np.flatnonzero(np.isin(target_weak, base_weak))
    lit_start = pos = 0
    ci = 0
    while ci < candidates.size:
        i = int(candidates[ci])
        if i < pos:
            ci = int(np.searchsorted(candidates, pos))
            continue
        found = None
        for s in index[int(target_weak[i])]:
            if base[s : s + block] == target[i : i + block]:
                found = s
                break
        if found is None:
            ci += 1
            continue
        length = _match_length(base, found, target, i)
        if i > lit_start:
            out += b"L" + struct.pack("<Q", i - lit_start) + target[lit_start:i]
        out += b"C" + struct.pack("<QQ", found, length)
        pos = lit_start = i + length
    if lit_start < len(target):
        out += b"L" + struct.pack("<Q", len(target) - lit_start) + target[lit_start:]
    return lzma.compress(bytes(out), preset=6)


def apply(base: bytes, delta: bytes) -> bytes:
    raw = lzma.decompress(delta)
    if raw[:8] != MAGIC:
        raise ValueError("not a ggml-dispatch binary delta")
    base_sha, target_sha = raw[8:40], raw[40:72]
    (size,) = struct.unpack_from("<Q", raw, 72)
    if hashlib.sha256(base).digest() != base_sha:
        raise ValueError("the delta was made against another base file")
    out = bytearray()
    p = 80
    while p < len(raw):
        op = raw[p : p + 1]
        if op == b"C":
            off, length = struct.unpack_from("<QQ", raw, p + 1)
            out += base[off : off + length]
            p += 17
        elif op == b"L":
            (length,) = struct.unpack_from("<Q", raw, p + 1)
            out += raw[p + 9 : p + 9 + length]
            p += 9 + length
        else:
            raise ValueError(f"bad delta op at {p}")
    if len(out) != size or hashlib.sha256(out).digest() != target_sha:
        raise ValueError("the rebuilt file does not match the delta's checksum")
    return bytes(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "make":
        Path(args[3]).write_bytes(make(Path(args[1]).read_bytes(), Path(args[2]).read_bytes()))
    elif len(args) == 4 and args[0] == "apply":
        Path(args[3]).write_bytes(apply(Path(args[1]).read_bytes(), Path(args[2]).read_bytes()))
    else:
        print(
            "usage: python -m lab.bindelta make BASE TARGET DELTA | apply BASE DELTA OUT",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
