"""OpenAI request validation and response shapes, as vLLM's OpenAI server produces them. Pure."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import time
import zlib
from typing import Any, Literal

Kind = Literal["completion", "chat"]

# Generated text cycles through these (one token each).
_WORDS = (
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".",
    " Lorem", " ipsum", " dolor", " sit", " amet", ",",
)  # fmt: skip
CHARS_PER_TOKEN = 4


class OpenAIError(Exception):
    """An error answered as vLLM does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, err_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": None, "code": self.status}}


def bad_request(message: str) -> OpenAIError:
    return OpenAIError(400, "BadRequestError", message)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, "NotFoundError", f"The model `{model}` does not exist.")


@dataclasses.dataclass(frozen=True)
class ParsedRequest:
    kind: Kind
    model: str | None
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    # The prompt as the simulator's tokenizer sees it (CHARS_PER_TOKEN characters a token), for
    # prefix-cache hashing and /tokenize.
    prompt_text: str = ""


def count_tokens(chars: int) -> int:
    """Cheap token estimate: ~4 characters per token, at least one."""
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def token_text(index: int) -> str:
    return _WORDS[index % len(_WORDS)]


def parse_request(kind: Kind, body: object) -> ParsedRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("`model` must be a string.")
    if kind == "completion":
        text = prompt_text(body.get("prompt"))
        max_tokens = _positive_int(body, "max_tokens")
    else:
        text = _messages_text(body.get("messages"))
        max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise bad_request("The simulator supports only n=1.")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise bad_request("`stream_options` must be an object.")
        include_usage = bool(options.get("include_usage", False))
    return ParsedRequest(
        kind=kind,
        model=model,
        prompt_tokens=count_tokens(len(text)),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        prompt_text=text,
    )


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"`{key}` must be a positive integer.")
    return value


def prompt_text(prompt: object) -> str:
    """A completion prompt as text; token ids become CHARS_PER_TOKEN characters each."""
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return _ids_text(prompt)
        if all(isinstance(p, list) for p in prompt):
            return "".join(_ids_text(p) for p in prompt)
    raise bad_request("`prompt` must be a non-empty string, list of strings or list of token ids.")


def _ids_text(ids: list[Any]) -> str:
    return "".join(f"{i % 10**CHARS_PER_TOKEN:0{CHARS_PER_TOKEN}d}" for i in ids)


def _messages_text(messages: object) -> str:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty list.")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("Each message must be an object with a string `role`.")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
        elif content is not None:
            raise bad_request("Message `content` must be a string or a list of content parts.")
    return "".join(parts)


VOCAB_SIZE = 32000


def token_ids(text: str) -> list[int]:
    """The simulator's tokenizer: one id per CHARS_PER_TOKEN characters, stable for equal text."""
    step = CHARS_PER_TOKEN
    return [zlib.crc32(text[i : i + step].encode()) % VOCAB_SIZE for i in range(0, len(text), step)]


# ---- responses -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResponseIds:
    id: str
    created: int
    model: str

    @staticmethod
    def new(kind: Kind, model: str) -> ResponseIds:
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        # 32 random hex digits, as vLLM's uuid4().hex (not a secret: the cheaper generator will do).
        token = f"{random.getrandbits(128):032x}"
        return ResponseIds(id=f"{prefix}-{token}", created=int(time.time()), model=model)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_response(
    kind: Kind, ids: ResponseIds, text: str, prompt_tokens: int, completion_tokens: int, finish_reason: str
) -> dict[str, Any]:
    if kind == "completion":
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    return {
        "id": ids.id,
        "object": obj,
        "created": ids.created,
        "model": ids.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(kind: Kind, ids: ResponseIds, text: str | None, finish_reason: str | None) -> dict[str, Any]:
    """One streamed chunk; for chat, ``text=None`` is the opening role-only delta."""
    if kind == "completion":
        choice: dict[str, Any] = {
            "index": 0,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "text_completion"
    else:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    return {"id": ids.id, "object": obj, "created": ids.created, "model": ids.model, "choices": [choice]}


class TokenEvents:
    """One streamed response's token chunks as SSE events, the bytes `sse_event(chunk(...))` gives.

    Every chunk of a response repeats its id, object, creation time and model: those parts are
    encoded once per response, and each token's text once per process, so a streamed token costs a
    few byte joins instead of a JSON encoding of the whole chunk (a third of the simulator's CPU per
    token went there).
    """

    __slots__ = ("_after_text", "_before_text", "_end")

    def __init__(self, kind: Kind, ids: ResponseIds) -> None:
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        head = _compact({"id": ids.id, "object": obj, "created": ids.created, "model": ids.model})[:-1]
        if kind == "completion":
            self._before_text = b"data: " + head + b',"choices":[{"index":0,"text":'
            self._after_text = b',"logprobs":null,"finish_reason":'
            self._end = b',"stop_reason":null}]}\n\n'
        else:
            self._before_text = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
            self._after_text = b'},"logprobs":null,"finish_reason":'
            self._end = b"}]}\n\n"

    def token(self, text: str, finish_reason: str | None) -> bytes:
        reason = b"null" if finish_reason is None else _json_string(finish_reason)
        return self._before_text + _json_string(text) + self._after_text + reason + self._end


def sse_event(payload: dict[str, Any]) -> bytes:
    """A JSON payload as one server-sent event, compact as vLLM sends it."""
    return b"data: " + _compact(payload) + b"\n\n"


def _compact(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    return json.dumps(text).encode()


def usage_chunk(kind: Kind, ids: ResponseIds, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {
        "id": ids.id,
        "object": obj,
        "created": ids.created,
        "model": ids.model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def model_card(
    name: str, *, root: str, parent: str | None, created: int, max_model_len: int | None
) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [],
    }
