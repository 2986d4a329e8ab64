"""Token usage from JSON and SSE bodies, including usage split at every possible byte."""

from __future__ import annotations

import pytest

from epp.handlers.usage import MAX_SSE_LINE_BYTES, SseUsageScanner, Usage, usage_from_json

FINAL = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":11}}\n\n'
STREAM = (
    b'data: {"id":"x","choices":[{"text":"a"}],"usage":null}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"id":"x","choices":[{"text":"b"}]}\r\n\r\n' + FINAL + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}', Usage(3, 4), id="both"),
        pytest.param(b'{"usage":{"prompt_tokens":3}}', Usage(3, 0), id="missing-field"),
        pytest.param(b'{"usage":{"prompt_tokens":"3","completion_tokens":true}}', Usage(0, 0),
                     id="wrong-types"),
        pytest.param(b'{"usage":{"prompt_tokens":3.0,"completion_tokens":4.5}}', Usage(3, 0), id="floats"),
        pytest.param(b'{"usage":[1,2]}', None, id="usage-not-object"),
        pytest.param(b'{"choices":[]}', None, id="no-usage"),
        pytest.param(b"[1]", None, id="not-object"),
        pytest.param(b"{broken", None, id="invalid"),
        pytest.param(b"\xff", None, id="not-utf8"),
    ],
)  # fmt: skip
def test_json_usage(body: bytes, expected: Usage | None) -> None:
    assert usage_from_json(body) == expected


def _scan(chunks: list[bytes]) -> Usage | None:
    scanner = SseUsageScanner()
    for chunk in chunks:
        scanner.feed(chunk)
    scanner.finish()
    return scanner.usage


def test_usage_found_whatever_the_split_point() -> None:
    for cut in range(len(STREAM) + 1):
        assert _scan([STREAM[:cut], STREAM[cut:]]) == Usage(7, 11), cut


def test_usage_found_when_fed_byte_by_byte() -> None:
    assert _scan([STREAM[i : i + 1] for i in range(len(STREAM))]) == Usage(7, 11)


def test_last_usage_wins_and_null_usage_is_ignored() -> None:
    first = b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    later = b'data: {"usage":null}\n\n'
    assert _scan([first, FINAL, later]) == Usage(7, 11)


def test_final_line_without_newline_counts() -> None:
    assert _scan([FINAL.rstrip()]) == Usage(7, 11)


def test_no_space_after_data_colon_is_accepted() -> None:
    assert _scan([b'data:{"usage":{"prompt_tokens":2,"completion_tokens":5}}\n']) == Usage(2, 5)


def test_only_data_lines_count() -> None:
    """Comments and other fields may mention usage, even as JSON five bytes in, like `data:` lines."""
    lines = [
        b':    {"usage":{"prompt_tokens":9,"completion_tokens":9}}\n',
        b'event {"usage":{"prompt_tokens":8}}\n',
    ]
    assert _scan(lines) is None


def test_indented_and_undecodable_lines_are_ignored() -> None:
    chunks = [b' data: {"usage":{"prompt_tokens":9}}\n', b'data: {"usage": oops}\n', b"data: [DONE]\n"]
    assert _scan(chunks) is None


def test_overlong_line_is_dropped_not_buffered() -> None:
    scanner = SseUsageScanner()
    scanner.feed(b"data: " + b"x" * (2 * 1024 * 1024))
    scanner.feed(b'"usage" tail of the long line\n')
    scanner.feed(FINAL)
    scanner.finish()
    assert scanner.usage == Usage(7, 11)


BOGUS = b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}'


def test_the_rest_of_an_overlong_line_is_never_read_as_a_line() -> None:
    """What arrives of an over-long line after the cut would parse as usage: it is dropped up to the
    line's newline, also at the end of the stream."""
    for rest in (BOGUS + b"\n", BOGUS):  # ended by its newline / by the stream
        scanner = SseUsageScanner()
        scanner.feed(FINAL)
        scanner.feed(b"data: " + b"x" * (MAX_SSE_LINE_BYTES + 10))
        scanner.feed(rest)
        scanner.finish()
        assert scanner.usage == Usage(7, 11), rest[-1:]


def test_after_an_overlong_line_the_rest_of_the_chunk_is_read() -> None:
    scanner = SseUsageScanner()
    scanner.feed(b"data: " + b"x" * (MAX_SSE_LINE_BYTES + 10))
    scanner.feed(b"more of it\n" + FINAL)
    scanner.finish()
    assert scanner.usage == Usage(7, 11)


def test_a_line_of_exactly_the_limit_still_counts() -> None:
    line = BOGUS + b" " * (MAX_SSE_LINE_BYTES - len(BOGUS))
    assert len(line) == MAX_SSE_LINE_BYTES
    assert _scan([FINAL, line[:100], line[100:], b"\n"]) == Usage(1, 1)
