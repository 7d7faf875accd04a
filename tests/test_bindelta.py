"""Binary deltas between builds: exact round trip, small deltas for small changes, refusal of a wrong base."""

from __future__ import annotations

import random

import pytest

from lab import bindelta


def _blob(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


def test_round_trip_with_insert_delete_and_change() -> None:
    rng = random.Random(7)
    base = _blob(rng, 300_000)
    # a build that differs in the middle: an object grew, one shrank, some bytes changed
    target = base[:50_000] + _blob(rng, 9_000) + base[50_000:120_000] + base[125_000:200_000]
    target = target[:150_000] + b"\x00" * 40 + target[150_040:] + _blob(rng, 3_000)
    delta = bindelta.make(base, target)
    assert bindelta.apply(base, delta) == target
    assert len(delta) < 20_000  # the literals (about 12 kB of random bytes) and a few copies


def test_unrelated_and_tiny_inputs() -> None:
    rng = random.Random(8)
    a, b = _blob(rng, 10_000), _blob(rng, 10_000)
    assert bindelta.apply(a, bindelta.make(a, b)) == b
    assert bindelta.apply(b"", bindelta.make(b"", b"xyz")) == b"xyz"
    assert bindelta.apply(a, bindelta.make(a, a)) == a


def test_wrong_base_is_refused() -> None:
    rng = random.Random(9)
    base = _blob(rng, 20_000)
    delta = bindelta.make(base, base[::-1])
    with pytest.raises(ValueError, match="another base"):
        bindelta.apply(base[1:] + b"x", delta)
