"""Read a request body once: check it is one JSON object, find its `model`, and where that value sits.

Why a scan and not `json.loads` + `json.dumps`: the EPP only needs `model` and the right to change it.
Re-encoding the whole object (as upstream and our first version did) changed what the client sent:
`1e999` came back as `Infinity` (not JSON), big numbers and key order depended on the encoder, and it
cost a second full pass over a multi-MB prompt. Here every top-level member is still decoded (so an
invalid body is a 400, exactly as strict JSON would have it), but the rewrite splices the new name
into the client's own bytes at the recorded offsets: nothing else in the body changes.

Rules (all failures are `BadRequest`, one readable line):
- UTF-8 (with or without BOM), UTF-16 or UTF-32, detected as `json.loads` does; a non-UTF-8 body is
  transcoded to UTF-8 for the rewrite (the only form a model server must accept, RFC 8259 §8.1);
- the top level is an object; `NaN`/`Infinity` literals are refused (not JSON);
- `model` is a string and appears once: a duplicate could make the EPP and the model server read
  different models from one body;
- nesting deeper than the interpreter allows is "nested too deeply", not a crash.
No I/O here: `epp.body.worker` runs the same function in a child process for big bodies.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from epp.body.prompt import prompt_head
from epp.errors import BadRequest

MODEL_KEY = "model"
_PROMPT_KEYS = ("prompt", "messages")  # what a prefix-aware scheduler reads (`prompt_head`)
_INVALID = "invalid JSON request body"
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_UTF8_BOM = b"\xef\xbb\xbf"


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN/Infinity; they are not JSON and a model server may choke on them.
    raise ValueError(f"{name} is not valid JSON")


# One decoder and scanner for every body (building them per call costs more than small bodies).
# `make_scanner` is the C scanner `JSONDecoder` itself uses; typeshed describes it as a class only.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN_VALUE: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]
_SCAN_STRING: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ScannedBody:
    """What the EPP learnt from a body: the model, and where its value is in the UTF-8 form.

    `transcoded` holds the body re-encoded as UTF-8 when the client sent UTF-16/32; it is None when
    the client's bytes are already UTF-8 (the common case: nothing is copied). `value_start` and
    `value_end` are byte offsets of the `model` value (quotes included) in that UTF-8 form.
    `prompt_head` is the start of the prompt text (`epp.body.prompt`), for prefix-aware routing.
    """

    model: str
    value_start: int
    value_end: int
    transcoded: bytes | None = None
    prompt_head: str = ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _invalid(detail: str) -> BadRequest:
    return BadRequest(f"{_INVALID}: {_one_line(detail)}")


def _decode_error(message: str, text: str, pos: int) -> BadRequest:
    return _invalid(str(json.JSONDecodeError(message, text, pos)))


def _skip_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    assert match is not None  # `*` always matches
    return match.end()


def scan_body(raw: bytes) -> ScannedBody:
    """The body's `model` and its position; BadRequest (400) for anything that is not such a body."""
    try:
        encoding = json.detect_encoding(raw)
        text = raw.decode(encoding, "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise _invalid(str(exc)) from exc
    prompt_fields: dict[str, Any] = {}
    try:
        start, end, model = _find_model(text, prompt_fields)
    except RecursionError as exc:
        raise BadRequest(f"{_INVALID}: nested too deeply") from exc
    if not isinstance(model, str):
        raise BadRequest(f'missing or non-string "{MODEL_KEY}" in request body')
    head = prompt_head(prompt_fields.get("prompt"), prompt_fields.get("messages"))
    if encoding == "utf-8" and text.isascii():
        # One byte per character: offsets carry over as they are.
        return ScannedBody(model, start, end, prompt_head=head)
    if encoding in ("utf-8", "utf-8-sig"):
        skip = len(_UTF8_BOM) if encoding == "utf-8-sig" else 0
        byte_start = skip + len(text[:start].encode("utf-8", "surrogatepass"))
        byte_end = byte_start + len(text[start:end].encode("utf-8", "surrogatepass"))
        return ScannedBody(model, byte_start, byte_end, prompt_head=head)
    utf8 = text.encode("utf-8", "surrogatepass")
    byte_start = len(text[:start].encode("utf-8", "surrogatepass"))
    byte_end = byte_start + len(text[start:end].encode("utf-8", "surrogatepass"))
    return ScannedBody(model, byte_start, byte_end, transcoded=utf8, prompt_head=head)


def _find_model(text: str, prompt_fields: dict[str, Any]) -> tuple[int, int, Any]:
    """Decode every top-level member of the object in `text`; (start, end, value) of `model`.

    Mirrors `json.decoder.JSONObject` one member at a time with the C scanner, so the work and the
    error messages are those of `json.loads`. `model` absent: (0, 0, None). The decoded `prompt` and
    `messages` members are left in `prompt_fields` (the last one wins, as with `json.loads`).
    """
    pos = _skip_whitespace(text, 0)
    if text[pos : pos + 1] != "{":
        _not_an_object(text)
    found: tuple[int, int, Any] = (0, 0, None)
    seen = False
    pos = _skip_whitespace(text, pos + 1)
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != '"':
                raise _decode_error("Expecting property name enclosed in double quotes", text, pos)
            try:
                key, pos = _SCAN_STRING(text, pos + 1)
            except json.JSONDecodeError as exc:
                raise _invalid(str(exc)) from exc
            pos = _skip_whitespace(text, pos)
            if text[pos : pos + 1] != ":":
                raise _decode_error("Expecting ':' delimiter", text, pos)
            start = _skip_whitespace(text, pos + 1)
            value, pos = _value_at(text, start)
            if key == MODEL_KEY:
                if seen:
                    raise BadRequest(f'duplicate "{MODEL_KEY}" in request body')
                seen = True
                found = (start, pos, value)
            elif key in _PROMPT_KEYS:
                prompt_fields[key] = value
            pos = _skip_whitespace(text, pos)
            delimiter = text[pos : pos + 1]
            pos = _skip_whitespace(text, pos + 1)
            if delimiter == "}":
                break
            if delimiter != ",":
                raise _decode_error("Expecting ',' delimiter", text, pos - 1)
    if _skip_whitespace(text, pos) != len(text):
        raise _decode_error("Extra data", text, _skip_whitespace(text, pos))
    return found


def _value_at(text: str, pos: int) -> tuple[Any, int]:
    try:
        value, end = _SCAN_VALUE(text, pos)
    except StopIteration as stop:
        raise _decode_error("Expecting value", text, stop.value) from None
    except ValueError as exc:  # JSONDecodeError, rejected constants, over-long integers
        raise _invalid(str(exc)) from exc
    return value, end


def _not_an_object(text: str) -> NoReturn:
    """Why a body that does not start with `{` is refused: its own decode error, or its type."""
    try:
        value = _DECODER.decode(text)
    except ValueError as exc:
        raise _invalid(str(exc)) from exc
    raise BadRequest(f"{_INVALID}: expected an object, got {type(value).__name__}")


def with_model(raw: bytes, scanned: ScannedBody, target: str) -> bytes:
    """The body with its `model` value replaced by `target`; every other byte as the client sent it.

    `target` comes from an InferenceModel, never from the client; it is written with ASCII escapes,
    so the result is valid UTF-8 JSON whatever the name contains.
    """
    base = raw if scanned.transcoded is None else scanned.transcoded
    return b"".join((base[: scanned.value_start], json.dumps(target).encode(), base[scanned.value_end :]))
