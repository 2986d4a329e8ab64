"""Pure request-side logic: parse the body, resolve the model, rewrite `model` when needed.

No I/O and no protobuf here, so every rule is table-testable. All failures are `EppError`s carrying
the one-line message the client sees.

Re-serialisation choice: when the target differs from the requested model the body is re-encoded
with `json.dumps(separators=(",", ":"), ensure_ascii=False)`: compact like Go's encoder, but keys keep
the client's order (Go sorts them), non-ASCII stays raw UTF-8, nothing is HTML-escaped and integers
keep full precision (Go goes through float64). No byte parity with upstream is needed; the body only
has to mean the same thing to the model server.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, NoReturn

from epp.api.types import InferenceModel
from epp.errors import BadRequest, ModelNotFound


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN/Infinity; they are not JSON and a model server may choke on them.
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every request (json.loads with a keyword argument builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class ParsedBody:
    fields: dict[str, Any]
    model: str


def parse_body(raw: bytes) -> ParsedBody:
    """The decoded JSON object and its `model`; BadRequest (400) otherwise."""
    try:
        # What json.loads does with bytes: UTF-8/16/32 detected from the first bytes.
        fields = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, rejected constants
        raise BadRequest(f"invalid JSON request body: {_one_line(str(exc))}") from exc
    except RecursionError as exc:
        raise BadRequest("invalid JSON request body: nested too deeply") from exc
    if not isinstance(fields, dict):
        raise BadRequest(f"invalid JSON request body: expected an object, got {type(fields).__name__}")
    model = fields.get("model")
    if not isinstance(model, str):
        raise BadRequest('missing or non-string "model" in request body')
    return ParsedBody(fields, model)


def not_found(model_name: str) -> ModelNotFound:
    return ModelNotFound(f"model {_one_line(model_name)[:256]} not found")


def pick_target(model: InferenceModel, rng: random.Random) -> str:
    """The model name to send upstream (epp-behaviour.md §6.5).

    No targetModels: the model itself (direct passthrough). Weights on the first entry: a weighted
    draw in [0, sum) where weight-0 entries never win. No weights: a uniform choice (#427).
    """
    targets = model.target_models
    if not targets:
        return model.model_name
    if targets[0].weight is None:
        return rng.choice(targets).name
    total = sum(t.weight or 0 for t in targets)
    if total <= 0:
        raise ModelNotFound(f"model {model.model_name} has no target model with a positive weight")
    r = rng.randrange(total)
    for t in targets:
        weight = t.weight or 0
        if r < weight:
            return t.name
        r -= weight
    raise AssertionError("unreachable: r < total")  # pragma: no cover


def rewrite_model(body: ParsedBody, target: str) -> bytes:
    """The body with `model` set to `target`, re-encoded (see the module docstring for the format)."""
    fields = dict(body.fields)
    fields["model"] = target
    text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate escape (\ud800) cannot be UTF-8: keep it escaped, as the client sent it.
        return json.dumps(fields, separators=(",", ":")).encode()
