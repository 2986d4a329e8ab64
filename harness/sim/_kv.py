"""KV-cache blocks with a prefix cache, as vLLM's paged block pool keeps them. Pure bookkeeping.

Every block is in one of three states:
- private: held by one running request (a partial block, generated tokens, a duplicate prompt block);
- cached and referenced: a full prompt block known by its hash, used by one or more running requests;
- cached and unreferenced: its content is still valid and a later request with the same prefix reuses
  it, but it counts as free; it is evicted (least recently released first) when a block is needed.
The rest are free. ``usage`` counts private and referenced blocks only, as vLLM's
``kv_cache_usage_perc`` does (an idle server with a warm prefix cache reports 0).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Sequence

_ROOT = 0x5EED


def block_hashes(units: Sequence[object], block_size: int, salt: str | None = None) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a token-like sequence (a partial last block has none).

    Each hash covers its block and everything before it, so equal hashes mean equal prefixes; the
    LoRA adapter salts the chain, as vLLM keys cached blocks by adapter.
    """
    out: list[int] = []
    parent = hash((_ROOT, salt))
    for start in range(0, len(units) - block_size + 1, block_size):
        parent = hash((parent, tuple(units[start : start + block_size])))
        out.append(parent)
    return tuple(out)


def text_block_hashes(
    text: str, block_size: int, chars_per_token: int, salt: str | None = None
) -> tuple[int, ...]:
    """Block hashes of a prompt text under the simulator's tokenizer (a token per ``chars_per_token``)."""
    block_chars = block_size * chars_per_token
    out: list[int] = []
    parent = hash((_ROOT, salt))
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = hash((parent, text[start : start + block_chars]))
        out.append(parent)
    return tuple(out)


class BlockPool:
    def __init__(self, num_blocks: int, *, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self._private = 0
        # hash -> number of running requests using the block (0: cached but evictable).
        self._refs: dict[int, int] = {}
        # The unreferenced cached blocks, least recently released first.
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()

    # ---- reading ---------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Blocks a running request holds (what vLLM reports as used)."""
        return self._private + len(self._refs) - len(self._evictable)

    @property
    def available(self) -> int:
        """Blocks an allocation can get now, evicting unreferenced cached blocks if needed."""
        return self.num_blocks - self.used

    @property
    def usage(self) -> float:
        return min(1.0, self.used / self.num_blocks)

    @property
    def cached(self) -> int:
        return len(self._refs)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of this prefix are cached (referenced or not)."""
        if not self.prefix_caching:
            return 0
        return sum(1 for _ in itertools.takewhile(self._refs.__contains__, hashes))

    # ---- writing ---------------------------------------------------------------------------
    def acquire_cached(self, hashes: Sequence[int]) -> None:
        """Reference cached blocks (a prefix hit); each must be cached (see ``match``)."""
        for h in hashes:
            count = self._refs[h]
            if count == 0:
                del self._evictable[h]
            self._refs[h] = count + 1

    def allocate(self, count: int) -> bool:
        """Take ``count`` private blocks, evicting cached ones as needed; False (nothing taken) if short."""
        if count > self.available:
            return False
        free = self.num_blocks - self._private - len(self._refs)
        while free < count:
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
            free += 1
        self._private += count
        return True

    def publish(self, h: int) -> bool:
        """Turn one of the caller's private blocks into the cached block ``h``.

        False when caching is off or ``h`` is already cached (another request computed the same prefix
        meanwhile): the caller's block then stays private.
        """
        if not self.prefix_caching or h in self._refs:
            return False
        self._private -= 1
        self._refs[h] = 1
        return True

    def release(self, private: int, hashes: Sequence[int]) -> None:
        """Give back private blocks (freed) and cached references (kept as evictable when unused)."""
        self._private -= private
        for h in hashes:
            count = self._refs[h] - 1
            self._refs[h] = count
            if count == 0:
                self._evictable[h] = None

    def reset(self) -> None:
        """Forget everything (no request may hold blocks)."""
        self._private = 0
        self._refs.clear()
        self._evictable.clear()


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)
