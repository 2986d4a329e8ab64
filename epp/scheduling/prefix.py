"""Prompt prefix blocks for prefix-cache-aware routing (pure).

Upstream's approximate prefix scheme (proposal 0602, plugin defaults): the prompt text is cut into
64-character blocks (about 16 tokens), each hashed together with the hash of everything before it, so
two prompts share their first k hashes exactly when they share their first k blocks. The target model
seeds the chain: a model server caches prefixes per adapter. Only full blocks count, and at most
``max_blocks`` of them (a very long prompt is matched on its beginning).
"""

from __future__ import annotations

from epp.config import DEFAULT_PREFIX_BLOCK_CHARS, DEFAULT_PREFIX_MAX_BLOCKS


def block_hashes(
    text: str,
    target_model: str,
    *,
    block_chars: int = DEFAULT_PREFIX_BLOCK_CHARS,
    max_blocks: int = DEFAULT_PREFIX_MAX_BLOCKS,
) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``text`` (stable within one process)."""
    if block_chars <= 0 or max_blocks <= 0:
        return ()
    count = min(len(text) // block_chars, max_blocks)
    out: list[int] = []
    parent = hash(target_model)
    for i in range(count):
        parent = hash((parent, text[i * block_chars : (i + 1) * block_chars]))
        out.append(parent)
    return tuple(out)
