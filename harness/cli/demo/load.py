"""The demo's load driver: what it sends through Envoy, in two phases, with the ``openai`` SDK.

1. **steady**: a weighted mix across the sample models, chat and completions, some streamed.
2. **saturated**: first real overload: long Critical requests for ``background-load`` (the base
   model) are kept in flight until every pod's queue and KV cache are past the EPP's shedding
   thresholds, as the EPP itself scrapes them; then the same mix of models as the steady phase is
   sent. Sheddable (and Standard) requests are shed with 429 because the pods are really full;
   Critical ones queue and are served. The background requests are cancelled at the end (the
   model servers abort them, as vLLM does when a client goes away).

In a v1 cluster a request names its InferenceObjective in a header: the client adds the one the
demo's cluster applied for the body's model (``Cluster.objective_headers_of_body``), so Critical,
Standard and Sheddable mean in v1 what they mean in v1alpha2.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.beds.stack import BASE_MODEL
from harness.cli.console import progress_bar

CONNECTION_ERROR: Final = 0  # Outcome.status when no HTTP response came back
REQUEST_TIMEOUT_S: Final = 60.0
# Share of the requests sent in the saturated phase.
SATURATED_SHARE: Final = 0.2
STREAM_SHARE: Final = 0.3
CHAT_SHARE: Final = 0.5
MAX_TOKENS_RANGE: Final = (8, 32)
# The background load: per pod, this many requests beyond its running slots wait in its queue
# (the EPP sheds non-critical traffic once every pod has more than 5 waiting or KV above 80%).
BACKGROUND_EXTRA_PER_POD: Final = 16
BACKGROUND_PROMPT_CHARS: Final = 7200  # 1,800 tokens: eight of them fill a pod's KV cache
BACKGROUND_MAX_TOKENS: Final = 400

# How often each requested model appears (both phases).
MIX: Final[dict[str, float]] = {
    "food-review": 0.35,
    "sql-lora": 0.25,
    BASE_MODEL: 0.2,
    "summaries-batch": 0.2,
}
PROMPTS: Final[dict[str, tuple[str, ...]]] = {
    "food-review": (
        "Review: the ramen was rich and the noodles perfectly chewy. Sentiment?",
        "Review: cold fries, slow service, never again. Sentiment?",
        "Review: decent pizza, but the crust was soggy in the middle. Sentiment?",
    ),
    "sql-lora": (
        "Write SQL: the ten customers with the highest total order value in 2024.",
        "Write SQL: monthly active users per country, last six months.",
    ),
    "summaries-batch": (
        "Summarize the following meeting notes in three bullet points: budget approved, launch moved "
        "to May, hiring two engineers, on-call rotation changes next week.",
        "Summarize this article in one sentence: the city council voted to extend the tram line.",
    ),
}
# The headers a request body calls for (``Cluster.objective_headers_of_body``).
HeadersOfBody = Callable[[bytes], Mapping[str, str]]

DEFAULT_PROMPTS: Final = (
    "Explain what a KV cache is in two sentences.",
    "Write a haiku about load balancers.",
)


@dataclass(frozen=True)
class Call:
    phase: str
    model: str
    chat: bool
    stream: bool
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Outcome:
    call: Call
    status: int  # HTTP status; CONNECTION_ERROR when none came back
    target: str | None  # the model that answered (the response's ``model``)
    seconds: float


def plan(total: int, rng: random.Random) -> tuple[list[Call], list[Call]]:
    """The steady phase (weighted mix) and the saturated phase (every model in turn)."""
    saturated_count = max(1, round(total * SATURATED_SHARE))
    names, weights = list(MIX), list(MIX.values())
    steady = [_call("steady", rng.choices(names, weights)[0], rng) for _ in range(total - saturated_count)]
    saturated = [_call("saturated", names[i % len(names)], rng) for i in range(saturated_count)]
    rng.shuffle(saturated)
    return steady, saturated


def _call(phase: str, model: str, rng: random.Random) -> Call:
    return Call(
        phase=phase,
        model=model,
        chat=rng.random() < CHAT_SHARE,
        stream=rng.random() < STREAM_SHARE,
        prompt=rng.choice(PROMPTS.get(model, DEFAULT_PROMPTS)),
        max_tokens=rng.randint(*MAX_TOKENS_RANGE),
    )


def status_class(status: int) -> str:
    if status == 200:
        return "ok"
    if status == 429:
        return "shed"
    return "error"


async def send(client: Any, call: Call) -> Outcome:
    """One request through the ``openai`` SDK; HTTP errors become the outcome's status."""
    import openai

    began = time.monotonic()
    target: str | None = None
    try:
        if call.chat:
            messages = [{"role": "user", "content": call.prompt}]
            if call.stream:
                chat_stream = await client.chat.completions.create(
                    model=call.model, messages=messages, max_tokens=call.max_tokens, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                async for chat_chunk in chat_stream:
                    target = target or chat_chunk.model
            else:
                reply = await client.chat.completions.create(
                    model=call.model, messages=messages, max_tokens=call.max_tokens
                )
                target = reply.model
        elif call.stream:
            stream = await client.completions.create(
                model=call.model, prompt=call.prompt, max_tokens=call.max_tokens, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            async for chunk in stream:
                target = target or chunk.model
        else:
            completion = await client.completions.create(
                model=call.model, prompt=call.prompt, max_tokens=call.max_tokens
            )
            target = completion.model
        status = 200
    except openai.APIStatusError as exc:
        status = exc.status_code
    except openai.APIConnectionError:  # includes timeouts
        status = CONNECTION_ERROR
    return Outcome(call, status, target, time.monotonic() - began)


def client(base_url: str, headers_of_body: HeadersOfBody | None = None) -> Any:
    """The SDK's async client; with ``headers_of_body``, each request gets the headers its body calls for."""
    import httpx2
    import openai

    options: dict[str, Any] = {}
    if headers_of_body is not None:

        async def add_headers(request: httpx2.Request) -> None:
            try:
                content = request.content
            except httpx2.RequestNotRead:  # a streamed upload: no model to read
                return
            request.headers.update(headers_of_body(content))

        # The SDK's own client (its connection limits: the saturated phase keeps ~130 in flight).
        options["http_client"] = openai.DefaultAsyncHttpxClient(event_hooks={"request": [add_headers]})
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S, **options
    )


async def send_all(
    sdk: Any, calls: Sequence[Call], concurrency: int, on_done: Callable[[Outcome], None]
) -> list[Outcome]:
    """Send ``calls`` with at most ``concurrency`` in flight (no retries: a 429 stays a 429)."""
    queue: asyncio.Queue[Call] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)
    outcomes: list[Outcome] = []

    async def worker() -> None:
        while not queue.empty():
            outcome = await send(sdk, queue.get_nowait())
            outcomes.append(outcome)
            on_done(outcome)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(calls)))))
    return outcomes


@contextlib.asynccontextmanager
async def background_load(sdk: Any, in_flight: int, model: str) -> AsyncIterator[None]:
    """Keep ``in_flight`` long Critical requests for ``model`` running until the block ends.

    Each is a unique 1,800-token prompt (no prefix-cache sharing) asking for 400 tokens; when one
    finishes another starts. Leaving the block cancels them all (the connections close, so the model
    servers abort them and free their slots and blocks).
    """
    counter = 0

    async def keep_one() -> None:
        nonlocal counter
        while True:
            counter += 1
            head = f"background request {counter}: summarize the following text. "
            prompt = (head + "lorem ipsum dolor sit amet " * 300)[:BACKGROUND_PROMPT_CHARS]
            with contextlib.suppress(Exception):  # a rejected or failed one is simply replaced
                await sdk.completions.create(model=model, prompt=prompt, max_tokens=BACKGROUND_MAX_TOKENS)

    tasks = [asyncio.create_task(keep_one(), name=f"background-load-{i}") for i in range(in_flight)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class PhaseRun:
    seconds: float
    outcomes: list[Outcome]
    before: Any = None  # what `before` returned
    after: Any = None  # what `after` returned


def run_phase(
    name: str,
    base_url: str,
    calls: Sequence[Call],
    concurrency: int,
    *,
    background: tuple[int, str] | None = None,
    before: Callable[[], Any] | None = None,
    after: Callable[[], Any] | None = None,
    headers_of_body: HeadersOfBody | None = None,
) -> PhaseRun:
    """Send one phase's calls with a progress bar.

    With ``background`` = (requests in flight, model) that load starts first and runs until the
    calls are done. ``before`` and ``after`` are blocking observations (they poll the EPP), run in a
    thread right before the calls go out and right after they are done, while the load still runs.
    ``headers_of_body``: what every request of the phase (background ones too) adds (``client``).
    """

    async def phase() -> PhaseRun:
        async with client(base_url, headers_of_body) as sdk:
            load = background_load(sdk, *background) if background is not None else contextlib.nullcontext()
            async with load:
                seen = await asyncio.to_thread(before) if before is not None else None
                with progress_bar(name, len(calls), counters=("ok", "shed", "error")) as bar:
                    began = time.monotonic()
                    outcomes = await send_all(
                        sdk, calls, concurrency, lambda o: bar.advance(**{status_class(o.status): 1})
                    )
                    seconds = time.monotonic() - began
                later = await asyncio.to_thread(after) if after is not None else None
            return PhaseRun(seconds, outcomes, seen, later)

    return asyncio.run(phase())
