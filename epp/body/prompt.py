"""The text a model server prefills for a request, as far as prefix-aware routing looks at it (pure).

Read during the body scan (the only pass over the body), so a prefix-aware scheduler needs no second
parse. Only the head is kept: prefix matching stops after a bounded number of blocks, and a big
prompt scanned in the child process should not cross the pipe whole.
"""

from __future__ import annotations

from typing import Any, Final

PROMPT_HEAD_CHARS: Final = 64 * 1024
"""How much of the prompt text is kept; more than the default prefix-block setting reads (256 blocks of
64 chars, 16 KiB)."""


def prompt_head(prompt: Any, messages: Any, limit: int = PROMPT_HEAD_CHARS) -> str:
    """`prompt` (completions) or the messages' text contents (chat), cut at `limit` characters.

    A batch of prompts routes on its first; token-id prompts and malformed messages give "".
    """
    if isinstance(prompt, str):
        return prompt[:limit]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        first: str = prompt[0]
        return first[:limit]
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    size = 0
    for message in messages:
        if size >= limit:
            break
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if isinstance(content, list)
            else []
        )
        for text in texts:
            parts.append(text)
            size += len(text)
    return "".join(parts)[:limit]
