"""Prompt prefix blocks: what text a request prefills, and hashes that match exactly on shared prefixes."""

from __future__ import annotations

from typing import Any

import pytest

from epp.body.prompt import prompt_head
from epp.scheduling.prefix import block_hashes


@pytest.mark.parametrize(
    ("body", "text"),
    [
        pytest.param({"prompt": "hello"}, "hello", id="completion"),
        pytest.param({"prompt": ["first", "second"]}, "first", id="batch-routes-on-the-first"),
        pytest.param(
            {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]},
            "syshi",
            id="chat",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]},
            "a",
            id="content-parts",
        ),
        pytest.param({"prompt": [1, 2, 3]}, "", id="token-ids"),
        pytest.param({"messages": "nope"}, "", id="malformed"),
    ],
)
def test_prompt_head(body: dict[str, Any], text: str) -> None:
    assert prompt_head(body.get("prompt"), body.get("messages")) == text


def test_prompt_head_is_cut_at_the_limit() -> None:
    messages = [{"role": "user", "content": "x" * 10}] * 5
    assert prompt_head(None, messages, limit=25) == "x" * 25
    assert prompt_head("y" * 30, None, limit=25) == "y" * 25


def test_shared_prefixes_share_leading_hashes_only() -> None:
    system = "s" * 128  # two blocks
    one = block_hashes(system + "question one" + "x" * 64, "m", block_chars=64)
    two = block_hashes(system + "question two" + "y" * 64, "m", block_chars=64)
    assert len(one) == len(two) == 3
    assert one[:2] == two[:2]
    assert one[2] != two[2]


def test_hashes_are_chained_so_a_block_counts_only_in_place() -> None:
    a = block_hashes("A" * 64 + "B" * 64, "m", block_chars=64)
    b = block_hashes("B" * 64, "m", block_chars=64)
    assert a[1] != b[0]


def test_the_target_model_salts_the_chain_and_partial_blocks_do_not_count() -> None:
    text = "p" * 130
    assert len(block_hashes(text, "m", block_chars=64)) == 2
    assert block_hashes(text, "m", block_chars=64) != block_hashes(text, "lora", block_chars=64)
    assert len(block_hashes(text * 10, "m", block_chars=64, max_blocks=3)) == 3


@pytest.mark.parametrize(
    ("block_chars", "max_blocks", "count"),
    [
        pytest.param(0, 8, 0, id="zero-block-size-is-no-blocks-not-a-division-by-zero"),
        pytest.param(-1, 8, 0, id="negative-block-size"),
        pytest.param(8, 0, 0, id="zero-max-blocks"),
        pytest.param(1, 8, 5, id="one-char-blocks"),
        pytest.param(2, 1, 1, id="one-block-at-most"),
        pytest.param(2, 8, 2, id="only-full-blocks"),
    ],
)
def test_block_size_and_limit_edges(block_chars: int, max_blocks: int, count: int) -> None:
    hashes = block_hashes("abcde", "m", block_chars=block_chars, max_blocks=max_blocks)
    assert len(hashes) == count
