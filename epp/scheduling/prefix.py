"""Prompt prefix blocks for prefix-cache-aware routing (pure).

Upstream's approximate prefix scheme (proposal 0602, plugin defaults): the prompt text is cut into
64-character blocks (about 16 tokens), each hashed together with the hash of everything before it, so
two prompts share their first k hashes exactly when they share their first k blocks. The target model
seeds the chain: a model server caches prefixes per adapter. Only full blocks count, and at most
``max_blocks`` of them (a very long prompt is matched on its beginning).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 128


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a model server prefills: `prompt` (completions) or the messages' contents (chat)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        first: str = prompt[0]
        return first  # a batch: route on its first prompt
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "".join(parts)


def block_hashes(
    text: str,
    target_model: str,
    *,
    block_chars: int = DEFAULT_BLOCK_CHARS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
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
