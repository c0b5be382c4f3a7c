"""Version-proof determinism: hash-derived uniform numbers, hash splits and a hash-driven RNG.

The embedded data must be byte-for-byte reproducible on any machine and Python/numpy version,
because a fresh clone regenerates ``data/`` and checks it against the md5 in ``data.dvc``.
``random.Random`` and numpy's generators make no such promise across versions, so every random
draw here is a SHA-256 of a text key: the same key gives the same number forever.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_UNIT_BITS = 64


def hash_int(key: str) -> int:
    """A 256-bit non-negative integer determined by ``key`` alone."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest(), "big")


def hash_unit(key: str) -> float:
    """A number in [0, 1) determined by ``key`` alone (the top 64 bits of its SHA-256)."""
    return (hash_int(key) >> (256 - _UNIT_BITS)) / float(1 << _UNIT_BITS)


def hash_split(key: str, test_fraction: float = 0.2, salt: str = "trace-split") -> str:
    """``"test"`` for about ``test_fraction`` of keys, ``"train"`` for the rest.

    A pure function of the key, so an item keeps its split whatever else is in the dataset.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction={test_fraction} must lie in [0, 1]")
    return "test" if hash_unit(f"{salt}:{key}") < test_fraction else "train"


class HashRng:
    """A tiny random generator whose n-th draw is the SHA-256 of ``"{stream}#{n}"``.

    Only integer draws are offered (and what is built on them), so no float formatting or
    platform arithmetic can creep into generated data. The modulo bias of a 256-bit hash
    reduced to ranges below 2**64 is below 2**-192: negligible.
    """

    def __init__(self, stream: str):
        self.stream = stream
        self._count = 0

    def _next(self) -> int:
        value = hash_int(f"{self.stream}#{self._count}")
        self._count += 1
        return value

    def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], both ends included."""
        if high < low:
            raise ValueError(f"randint: empty range [{low}, {high}]")
        return low + self._next() % (high - low + 1)

    def choice(self, items: Sequence[T]) -> T:
        if not items:
            raise ValueError("choice: empty sequence")
        return items[self.randint(0, len(items) - 1)]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        """A shuffled copy (Fisher-Yates)."""
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.randint(0, i)
            out[i], out[j] = out[j], out[i]
        return out

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items in random order."""
        if not 0 <= k <= len(items):
            raise ValueError(f"sample: k={k} not in [0, {len(items)}]")
        return self.shuffled(items)[:k]
