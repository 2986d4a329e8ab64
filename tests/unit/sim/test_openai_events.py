"""The simulator's pre-encoded SSE token chunks are byte for byte the JSON chunks they stand for."""

from __future__ import annotations

import json

import pytest

from harness.sim import _openai as oai

TEXTS = ["hello", " world", 'say "hi"', "back\\slash", "naïve ☃", "", "\n\t", "x" * 300]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("finish_reason", [None, "length", "stop"])
def test_a_token_event_is_the_chunk_encoded_as_json(kind: oai.Kind, finish_reason: str | None) -> None:
    ids = oai.ResponseIds(id='cmpl-0f"1', created=1_700_000_000, model="meta-llama/Llama-3.1-8B-Instruct")
    events = oai.TokenEvents(kind, ids)
    for text in TEXTS + [oai.token_text(index) for index in range(64)]:
        expected = oai.sse_event(oai.chunk(kind, ids, text, finish_reason))
        assert events.token(text, finish_reason) == expected
        assert json.loads(expected.removeprefix(b"data: "))["model"] == ids.model


def test_an_sse_event_is_compact_json_framed_as_one_event() -> None:
    assert oai.sse_event({"a": [1, None], "b": "ü"}) == b'data: {"a":[1,null],"b":"\\u00fc"}\n\n'
