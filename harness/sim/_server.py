"""``ModelServerSim``: the aiohttp server in front of the simulated engine (and its admin listener)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from harness.sim import _openai as oai
from harness.sim._admin import admin_app
from harness.sim._config import DEFAULT_PORT, SimConfig
from harness.sim._engine import Engine, EngineState, Run
from harness.sim._kv import text_block_hashes
from harness.sim._metrics import GaugeOverrides, SimMetrics
from harness.sim._received import ReceivedLog, ReceivedRequest

if TYPE_CHECKING:
    from harness.sim._h2c import H2cFront

SERVED_BY_HEADER = "x-served-by"
# Large enough for multi-MiB prompts (aiohttp's default is 1 MiB).
_CLIENT_MAX_SIZE = 64 * 1024 * 1024
# How long stop() lets in-flight requests finish before cancelling them.
_SHUTDOWN_TIMEOUT_S = 1.0
_CROSS_THREAD_TIMEOUT_S = 10.0

T = TypeVar("T")


class ModelServerSim:
    """An OpenAI-compatible vLLM stand-in on its own loopback address.

    Use ``async with ModelServerSim(...)`` on a running loop, or ``SimThread(sim)`` from sync code.
    ``set_gauges``/``clear_overrides``, ``requests_by_model`` and ``state()`` are safe to call from
    any thread.

    ``admin_port``: also serve the test controls (``harness.sim._admin``) on that port of the same
    address, apart from the serving port, so nothing sent through a gateway to the serving port can
    reach them. ``healthy=False`` starts with ``/health`` answering 503 (a pod that never gets Ready
    until told otherwise).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        config: SimConfig | None = None,
        *,
        admin_port: int | None = None,
        healthy: bool = True,
    ) -> None:
        self.config = config or SimConfig()
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._requested_admin_port = admin_port
        self._admin_port: int | None = None
        # Swapped whole (any thread may set them; the loop only reads them).
        self.healthy = healthy
        self._blackholed: frozenset[str] = frozenset()
        # Set (and replaced) on the loop whenever black holes are lifted: the held requests re-check.
        self._released = asyncio.Event()
        self.engine = Engine(self.config)
        self.metrics = SimMetrics(self.config, self.engine)
        # Registered adapter names; replaced as a whole so other threads can swap it.
        self._adapters: frozenset[str] = frozenset(self.config.lora_adapters)
        self._counts_lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._scrapes = 0  # under _counts_lock
        self._received = ReceivedLog()
        self._runner: web.AppRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._h2c: H2cFront | None = None
        self._h2_socket: str | None = None  # where the h2c front hands on HTTP/2 streams
        self._socket_dir: Path | None = None
        self._created = int(time.time())

    # ---- addresses -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound port (the requested one until started; the real one when port 0 was asked)."""
        return self._port if self._port is not None else self._requested_port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    @property
    def admin_port(self) -> int | None:
        """The bound admin port (None when there is no admin listener)."""
        return self._admin_port if self._admin_port is not None else self._requested_admin_port

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError(f"simulator {self.address} already started")
        app = web.Application(client_max_size=_CLIENT_MAX_SIZE, middlewares=[self._black_hole])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions/render", self._render)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.on_response_prepare.append(self._add_served_by)
        # handler_cancellation: a client that disconnects aborts its request and frees its slot, as in vLLM.
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S, handler_cancellation=True
        )
        await runner.setup()
        try:
            if self.config.h2c:
                self._port = await self._start_h2c(runner)
            else:
                site = web.TCPSite(runner, self.host, self._requested_port, reuse_address=True)
                await site.start()
                self._port = int(runner.addresses[0][1])
        except BaseException:
            await self._stop_h2c()
            await runner.cleanup()
            raise
        self._runner = runner
        self._loop = asyncio.get_running_loop()
        if self._requested_admin_port is not None:
            try:
                self._admin_runner = await _serve(admin_app(self), self.host, self._requested_admin_port)
            except BaseException:
                await self.stop()
                raise
            self._admin_port = int(self._admin_runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening, let requests in flight finish (up to a second), then cancel the rest."""
        runners = (self._admin_runner, self._runner)
        self._admin_runner = self._runner = None
        self.black_hole(())  # held requests are answered before the server goes, not cancelled
        await self._stop_h2c()
        for runner in runners:
            if runner is not None:
                await runner.cleanup()
        await self.engine.aclose()
        self._loop = None

    async def _start_h2c(self, runner: web.AppRunner) -> int:
        """The serving port as an `H2cFront` (HTTP/1.1 and h2c), the application behind it on two
        Unix sockets in a temp dir; the bound port."""
        # Imported here: only an h2c simulator needs the `h2` library (the simulator's image has none).
        from harness.sim._h2c import H1_SOCKET, H2_SOCKET, H2cFront

        self._socket_dir = Path(tempfile.mkdtemp(prefix="sim-h2c-"))
        for name in (H1_SOCKET, H2_SOCKET):
            await web.UnixSite(runner, str(self._socket_dir / name)).start()
        self._h2_socket = str(self._socket_dir / H2_SOCKET)
        self._h2c = H2cFront(self.host, self._requested_port, self._socket_dir)
        await self._h2c.start()
        return self._h2c.port

    async def _stop_h2c(self) -> None:
        front, self._h2c = self._h2c, None
        if front is not None:
            await front.stop()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = self._h2_socket = None

    def _http_version(self, request: web.Request) -> str:
        """ "2" for a request the h2c front passed on from an HTTP/2 stream (its own socket says so)."""
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        if self._h2_socket is not None and sockname == self._h2_socket:
            return "2"
        return f"{request.version.major}.{request.version.minor}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- test controls (any thread) -----------------------------------------------------------
    def set_gauges(
        self,
        *,
        waiting: float | None = None,
        running: float | None = None,
        kv_cache: float | None = None,
        running_loras: Sequence[str] | None = None,
        waiting_loras: Sequence[str] | None = None,
        max_lora: int | None = None,
    ) -> None:
        """Pin reported gauge values over the real state; arguments left None keep earlier pins.

        Pinning any LoRA field replaces the ``vllm:lora_requests_info`` history with one series
        whose value (its update time) is the time of this call.
        """

        def update(old: GaugeOverrides) -> GaugeOverrides:
            new = GaugeOverrides(
                waiting=old.waiting if waiting is None else waiting,
                running=old.running if running is None else running,
                kv_cache=old.kv_cache if kv_cache is None else kv_cache,
                running_loras=old.running_loras if running_loras is None else tuple(running_loras),
                waiting_loras=old.waiting_loras if waiting_loras is None else tuple(waiting_loras),
                max_lora=old.max_lora if max_lora is None else max_lora,
                lora_updated_at=old.lora_updated_at,
            )
            if running_loras is not None or waiting_loras is not None or max_lora is not None:
                new = dataclasses.replace(new, lora_updated_at=time.time())
            return new

        self.metrics.pin(update)

    def clear_overrides(self) -> None:
        self.metrics.clear()

    def black_hole(self, paths: Sequence[str]) -> None:
        """Requests to ``paths`` hang (no answer, connection kept) until the paths are lifted.

        A model server whose engine is stuck while its ``/health`` still answers: scrapes and
        generation time out, readiness stays. Any thread; ``()`` lifts it.
        """
        self._blackholed = frozenset(paths)
        loop = self._loop
        if loop is not None:
            if _on_loop(loop):
                self._release_held()
            else:
                loop.call_soon_threadsafe(self._release_held)

    def _release_held(self) -> None:
        released, self._released = self._released, asyncio.Event()
        released.set()

    @property
    def black_holed(self) -> frozenset[str]:
        return self._blackholed

    @property
    def requests_by_model(self) -> dict[str, int]:
        """Requests accepted so far, by the model name they asked for (base or adapter)."""
        with self._counts_lock:
            return dict(self._counts)

    @property
    def scrapes(self) -> int:
        """``/metrics`` pages served so far (by any scraper)."""
        with self._counts_lock:
            return self._scrapes

    def received_requests(self) -> list[ReceivedRequest]:
        """Generation requests as they arrived (headers with repeats, raw body), oldest first."""
        return self._received.snapshot()

    @property
    def lora_adapters(self) -> frozenset[str]:
        return self._adapters

    def state(self) -> EngineState:
        """The engine's real state (ignores overrides)."""
        loop = self._loop
        if loop is None or _on_loop(loop):
            return self.engine.state()

        async def read() -> EngineState:
            return self.engine.state()

        return asyncio.run_coroutine_threadsafe(read(), loop).result(_CROSS_THREAD_TIMEOUT_S)

    def reset(self, time_scale: float | None = None) -> None:
        """Cold start between benchmark runs: empty prefix cache, no adapter loaded, no pins, counts zero.

        The engine must be idle (every request finished); any thread. ``time_scale`` changes the
        speed of simulated time from now on (``Engine.reset``).
        """
        self.call_on_loop(lambda: self.engine.reset(time_scale))
        self.metrics.clear()
        with self._counts_lock:
            self._counts.clear()

    def call_on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the simulator's event loop (engine state is only touched there)."""
        loop = self._loop
        if loop is None or _on_loop(loop):
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(_CROSS_THREAD_TIMEOUT_S)

    def metrics_text(self) -> str:
        """The ``/metrics`` page as a scrape would see it now."""
        loop = self._loop
        if loop is None or _on_loop(loop):
            return self.metrics.render().decode()

        async def render() -> bytes:
            return self.metrics.render()

        return asyncio.run_coroutine_threadsafe(render(), loop).result(_CROSS_THREAD_TIMEOUT_S).decode()

    # ---- handlers ----------------------------------------------------------------------------
    async def _add_served_by(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SERVED_BY_HEADER] = self.address

    @web.middleware
    async def _black_hole(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        while request.path in self._blackholed:
            await self._released.wait()
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        if not self.healthy:
            return web.Response(status=503, text="unhealthy (set through the admin port)")
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        with self._counts_lock:
            self._scrapes += 1
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _models(self, request: web.Request) -> web.Response:
        cfg = self.config
        cards = [
            oai.model_card(
                cfg.model, root=cfg.model, parent=None, created=self._created, max_model_len=cfg.max_model_len
            )
        ]
        for name in sorted(self._adapters):
            cards.append(
                oai.model_card(
                    name,
                    root=f"/adapters/{name}",
                    parent=cfg.model,
                    created=self._created,
                    max_model_len=None,
                )
            )
        return web.json_response({"object": "list", "data": cards})

    def block_hashes(self, prompt_text: str, lora: str | None) -> tuple[int, ...]:
        """The prefix-cache keys of a prompt's full blocks on this server (the adapter salts them)."""
        return text_block_hashes(prompt_text, self.config.block_size, oai.CHARS_PER_TOKEN, salt=lora)

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize`` (vllm-router's cache_aware falls back to it): token ids of a prompt."""
        try:
            body = await _read_json(request)
            if isinstance(body, dict) and "messages" in body:
                text = oai.parse_request("chat", {"max_tokens": 1, **body}).prompt_text
            else:
                text = oai.prompt_text(body.get("prompt") if isinstance(body, dict) else None)
        except oai.OpenAIError as err:
            return _error_response(err)
        tokens = oai.token_ids(text)
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens}
        )

    async def _render(self, request: web.Request) -> web.Response:
        """vLLM's ``/v1/completions/render``: the prompt(s) as token ids, without generating."""
        try:
            body = await _read_json(request)
            prompt = body.get("prompt") if isinstance(body, dict) else None
            several = isinstance(prompt, list) and all(isinstance(p, str) for p in prompt)
            prompts: list[Any] = prompt if several and isinstance(prompt, list) else [prompt]
            rendered = [{"token_ids": oai.token_ids(oai.prompt_text(p))} for p in prompts]
        except oai.OpenAIError as err:
            return _error_response(err)
        return web.json_response(rendered)

    async def _load_lora(self, request: web.Request) -> web.Response:
        try:
            name = _lora_name(await _read_json(request))
            if name in self._adapters or name == self.config.model:
                raise oai.bad_request(f"The lora adapter '{name}' has already been loaded.")
        except oai.OpenAIError as err:
            return _error_response(err)
        self._adapters = self._adapters | {name}
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        try:
            name = _lora_name(await _read_json(request))
            if name not in self._adapters:
                raise oai.OpenAIError(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        except oai.OpenAIError as err:
            return _error_response(err)
        self._adapters = self._adapters - {name}
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: oai.Kind) -> web.StreamResponse:
        cfg = self.config
        self._received.record(
            request.method,
            request.path,
            request.raw_headers,
            await request.read(),
            self._http_version(request),
        )
        try:
            parsed = oai.parse_request(kind, await _read_json(request))
            model = cfg.model if parsed.model is None else parsed.model  # vLLM's default model
            if model != cfg.model and model not in self._adapters:
                raise oai.model_not_found(model)
            max_tokens = parsed.max_tokens or cfg.default_max_tokens
            if cfg.max_model_len is not None and parsed.prompt_tokens + max_tokens > cfg.max_model_len:
                raise oai.bad_request(
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                    f"requested {parsed.prompt_tokens + max_tokens} tokens ({parsed.prompt_tokens} in the "
                    f"messages, {max_tokens} in the completion). Please reduce the length of the messages "
                    "or completion."
                )
        except oai.OpenAIError as err:
            return _error_response(err)

        with self._counts_lock:
            self._counts[model] += 1
        lora = None if model == cfg.model else model
        run = self.engine.submit(
            lora=lora,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=max_tokens,
            block_hashes=self.block_hashes(parsed.prompt_text, lora),
        )
        ids = oai.ResponseIds.new(kind, model)
        finished = False
        try:
            await run.wait_admitted()
            if parsed.stream:
                response, finished = await self._stream(request, run, parsed, ids)
                return response
            text: list[str] = []
            while (index := await run.next_token()) is not None:
                text.append(oai.token_text(index))
            finished = True
            body = oai.full_response(kind, ids, "".join(text), parsed.prompt_tokens, run.generated, "length")
            return web.json_response(body)
        finally:
            run.close()
            self.metrics.observe_finished(
                prompt_tokens=parsed.prompt_tokens,
                generated=run.generated,
                max_tokens=max_tokens,
                timings=run.timings(),
                reason="length" if finished else "abort",
            )

    async def _stream(
        self, request: web.Request, run: Run, parsed: oai.ParsedRequest, ids: oai.ResponseIds
    ) -> tuple[web.StreamResponse, bool]:
        kind = parsed.kind
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if kind == "chat":
                await response.write(oai.sse_event(oai.chunk(kind, ids, None, None)))
            events = oai.TokenEvents(kind, ids)
            while (index := await run.next_token()) is not None:
                last = run.generated >= run.max_tokens
                await response.write(events.token(oai.token_text(index), "length" if last else None))
            if parsed.include_usage:
                await response.write(
                    oai.sse_event(oai.usage_chunk(kind, ids, parsed.prompt_tokens, run.generated))
                )
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away
            return response, False
        return response, True


async def _serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as err:
        raise oai.bad_request(f"Malformed JSON in the request body: {err}") from err


def _lora_name(body: object) -> str:
    name = body.get("lora_name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise oai.bad_request("`lora_name` must be a non-empty string.")
    return name


def _error_response(err: oai.OpenAIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)
