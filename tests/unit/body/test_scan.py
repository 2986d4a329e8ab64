"""Reading a request body: validity and `model` (400s), and the rewrite that changes only `model`."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.body import ScannedBody, scan_body, with_model
from epp.errors import BadRequest


def strict_json(raw: bytes) -> Any:
    """What a strict JSON reader makes of `raw`: NaN/Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(b"{", "invalid JSON request body: Expecting property name", id="truncated"),
        pytest.param(b"", "invalid JSON request body: Expecting value", id="empty"),
        pytest.param(b'"model"', "invalid JSON request body: expected an object, got str", id="string"),
        pytest.param(b"null", "invalid JSON request body: expected an object, got NoneType", id="null"),
        pytest.param(b'{"model": NaN}', "invalid JSON request body: NaN is not valid JSON", id="nan"),
        pytest.param(
            b'{"model": "m", "t": -Infinity}',
            "invalid JSON request body: -Infinity is not valid",
            id="minus-infinity",
        ),
        pytest.param(b"\xff\xfe\x00", "invalid JSON request body: ", id="bad-encoding"),
        pytest.param(b"[" * 100_000, "invalid JSON request body: nested too deeply", id="too-deep-array"),
        pytest.param(
            b'{"model": "m", "x": ' + b'{"a":' * 100_000,
            "invalid JSON request body: nested too deeply",
            id="too-deep-object",
        ),
        pytest.param(b'{"model": "m"} {}', "invalid JSON request body: Extra data", id="extra-data"),
        pytest.param(
            b'{"model": "m",}', "invalid JSON request body: Expecting property name", id="trailing-comma"
        ),
        pytest.param(b'{"model" "m"}', "invalid JSON request body: Expecting ':' delimiter", id="no-colon"),
        pytest.param(
            b'{"model": "m" "x": 1}', "invalid JSON request body: Expecting ',' delimiter", id="no-comma"
        ),
        pytest.param(
            b'{"model": "m\x01"}',
            "invalid JSON request body: Invalid control character",
            id="control-character",
        ),
        pytest.param(
            b'{"model": "m", "n": 1' + b"0" * 5000 + b"}",
            "invalid JSON request body: ",
            id="integer-too-long",
        ),
        pytest.param(b"{}", 'missing or non-string "model" in request body', id="no-model"),
        pytest.param(b'{"model": null}', 'missing or non-string "model" in request body', id="null-model"),
        pytest.param(b'{"model": ["a"]}', 'missing or non-string "model" in request body', id="list-model"),
        pytest.param(b'{"x": {"model": "m"}}', 'missing or non-string "model"', id="nested-model-only"),
        pytest.param(
            b'{"model": "a", "model": "b"}', 'duplicate "model" in request body', id="duplicate-model"
        ),
    ],
)
def test_bad_bodies_are_400_with_one_line(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        scan_body(raw)
    assert info.value.http_status == 400
    assert info.value.message.startswith(message)
    assert "\n" not in info.value.message


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        pytest.param(b'{"model":"m","prompt":"hi"}', b'{"model":"t","prompt":"hi"}', id="compact"),
        pytest.param(
            b'{ "prompt" : "hi" ,\n "model" :\t"m" }',
            b'{ "prompt" : "hi" ,\n "model" :\t"t" }',
            id="spacing-and-order-kept",
        ),
        pytest.param(
            '{"p": "é<>&", "model": "m"}'.encode(),
            '{"p": "é<>&", "model": "t"}'.encode(),
            id="raw-utf8-before-model",
        ),
        pytest.param(
            b'{"model": "m", "n": 12345678901234567890123, "f": 0.1, "z": -0.0}',
            b'{"model": "t", "n": 12345678901234567890123, "f": 0.1, "z": -0.0}',
            id="numbers-as-sent",
        ),
        pytest.param(
            b'{"model": "m", "t": 1e999, "u": -1E400}',
            b'{"model": "t", "t": 1e999, "u": -1E400}',
            id="out-of-range-numbers-stay-json",
        ),
        pytest.param(
            b'{"p": "\\ud800", "model": "m"}', b'{"p": "\\ud800", "model": "t"}', id="escaped-surrogate"
        ),
        pytest.param(b'{"model": "\\u006d"}', b'{"model": "t"}', id="escaped-model-value"),
        pytest.param(
            b'\xef\xbb\xbf{"\xc3\xa9": 1, "model": "m"}',
            b'\xef\xbb\xbf{"\xc3\xa9": 1, "model": "t"}',
            id="utf8-bom-kept",
        ),
        pytest.param(
            '{"é": 1, "model": "m"}'.encode("utf-16"),
            '{"é": 1, "model": "t"}'.encode(),
            id="utf16-becomes-utf8",
        ),
        pytest.param('{"model": "m"}'.encode("utf-32-le"), b'{"model": "t"}', id="utf32-becomes-utf8"),
    ],
)
def test_the_rewrite_changes_only_the_model(sent: bytes, expected: bytes) -> None:
    scanned = scan_body(sent)
    assert scanned.model == "m"
    out = with_model(sent, scanned, "t")
    assert out == expected
    assert strict_json(out)["model"] == "t"


def test_a_target_name_is_written_as_ascii_json() -> None:
    sent = b'{"model": "m"}'
    out = with_model(sent, scan_body(sent), 'lora-"é"\n')
    assert out == b'{"model": "lora-\\"\\u00e9\\"\\n"}'
    assert strict_json(out) == {"model": 'lora-"é"\n'}


def test_non_finite_numbers_never_come_out_as_infinity() -> None:
    """`1e999` used to be re-encoded as `Infinity`, which no strict JSON reader accepts."""
    sent = b'{"model": "m", "temperature": 1e999, "top_p": -1e999}'
    out = with_model(sent, scan_body(sent), "target")
    assert b"Infinity" not in out
    assert math.isinf(strict_json(out)["temperature"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "model"), json_values, max_size=6),
    model=st.text(max_size=20),
    target=st.text(max_size=20),
    position=st.integers(min_value=0, max_value=6),
    ensure_ascii=st.booleans(),
    indent=st.sampled_from([None, 0, 2]),
)
def test_any_object_keeps_every_other_member(
    fields: dict[str, Any], model: str, target: str, position: int, ensure_ascii: bool, indent: int | None
) -> None:
    items = list(fields.items())
    items.insert(min(position, len(items)), ("model", model))
    sent = json.dumps(dict(items), ensure_ascii=ensure_ascii, indent=indent).encode("utf-8", "surrogatepass")
    scanned = scan_body(sent)
    assert scanned == ScannedBody(scanned.model, scanned.value_start, scanned.value_end)
    assert scanned.model == model
    out = with_model(sent, scanned, target)
    assert json.loads(out) == {**dict(items), "model": target}


@pytest.mark.parametrize(
    ("raw", "head"),
    [
        pytest.param(b'{"model": "m", "prompt": "hello"}', "hello", id="completion"),
        pytest.param(
            b'{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],'
            b' "model": "m"}',
            "syshi",
            id="chat",
        ),
        pytest.param(b'{"model": "m", "prompt": [1, 2]}', "", id="token-ids"),
        pytest.param('{"model": "m", "prompt": "héllo"}'.encode("utf-16"), "héllo", id="utf16"),
    ],
)
def test_the_scan_keeps_the_prompt_head_for_prefix_routing(raw: bytes, head: str) -> None:
    assert scan_body(raw).prompt_head == head
