"""The simulator's admin listener: what a test may change or read, over HTTP only.

Tests reach model servers the way a user reaches pods: over the network, at the pod's address. The
node agent runs each simulator as a process of its own, so the test controls that used to be method
calls are small HTTP endpoints here. They listen on a port of their own (the serving port + 10000 by
default, ``--admin-port``), never on the serving port: Envoy forwards client requests to
``podIP:targetPortNumber`` only, so nothing sent through the gateway can pin a gauge.

    GET  /admin/info        pid, model, adapters, address, healthy, black-holed paths
    PUT  /admin/gauges      {"waiting": 3, "kv_cache": 0.4, "running_loras": ["a"], ...}: pin
    DELETE /admin/gauges    drop every pin
    PUT  /admin/health      {"healthy": false}: /health answers 503 (readiness probes fail)
    PUT  /admin/black-hole  {"paths": ["/metrics"]}: requests there hang; [] lifts it
    GET  /admin/requests    accepted generation requests by requested model
    GET  /admin/received    every generation request as it arrived (headers, body in base64)
    GET  /admin/state       the engine's real state (queue, running, KV usage, adapters)

Bad input gets a 400 with a one-line JSON message, like the OpenAI side.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from aiohttp import web

from harness.sim._config import SimConfig
from harness.sim._engine import EngineState
from harness.sim._received import ReceivedRequest

ADMIN_PORT_OFFSET: Final = 10000
"""Default admin port: the serving port plus this (8000 -> 18000), so each container of a pod has one."""

GAUGE_KEYS: Final = ("waiting", "running", "kv_cache", "running_loras", "waiting_loras", "max_lora")
_LIST_GAUGES: Final = ("running_loras", "waiting_loras")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminTarget(Protocol):
    """What the admin listener reads and changes of a simulator (``ModelServerSim`` is one).

    A Protocol rather than the server class, so the server may import this module and not the reverse.
    """

    config: SimConfig
    healthy: bool

    @property
    def address(self) -> str: ...
    @property
    def lora_adapters(self) -> frozenset[str]: ...
    @property
    def black_holed(self) -> frozenset[str]: ...
    @property
    def requests_by_model(self) -> dict[str, int]: ...
    def set_gauges(
        self,
        *,
        waiting: float | None = None,
        running: float | None = None,
        kv_cache: float | None = None,
        running_loras: Sequence[str] | None = None,
        waiting_loras: Sequence[str] | None = None,
        max_lora: int | None = None,
    ) -> None: ...
    def clear_overrides(self) -> None: ...
    def black_hole(self, paths: Sequence[str]) -> None: ...
    def received_requests(self) -> list[ReceivedRequest]: ...
    def state(self) -> EngineState: ...


class AdminInputError(ValueError):
    """A malformed admin request (answered 400)."""


def admin_app(sim: AdminTarget) -> web.Application:
    app = web.Application(middlewares=[_json_errors])
    app.router.add_get("/admin/info", _handler(lambda r: _info(sim)))
    app.router.add_put("/admin/gauges", _json_handler(lambda body: _pin(sim, body)))
    app.router.add_delete("/admin/gauges", _handler(lambda r: _clear(sim)))
    app.router.add_put("/admin/health", _json_handler(lambda body: _health(sim, body)))
    app.router.add_put("/admin/black-hole", _json_handler(lambda body: _black_hole(sim, body)))
    app.router.add_get("/admin/requests", _handler(lambda r: {"by_model": sim.requests_by_model}))
    app.router.add_get("/admin/received", _handler(lambda r: _received(sim)))
    app.router.add_get("/admin/state", _handler(lambda r: dataclasses.asdict(sim.state())))
    return app


def _handler(answer: Callable[[web.Request], Any]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(answer(request))

    return handle


def _json_handler(answer: Callable[[Mapping[str, Any]], Any]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            raise AdminInputError(f"the body is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise AdminInputError("the body must be a JSON object")
        return web.json_response(answer(body))

    return handle


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AdminInputError as err:
        return web.json_response({"error": str(err)}, status=400)


def _info(sim: AdminTarget) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "model": sim.config.model,
        "adapters": sorted(sim.lora_adapters),
        "address": sim.address,
        "healthy": sim.healthy,
        "black_holed": sorted(sim.black_holed),
    }


def _pin(sim: AdminTarget, body: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(body) - set(GAUGE_KEYS)
    if unknown:
        raise AdminInputError(f"unknown gauges {sorted(unknown)}; known: {list(GAUGE_KEYS)}")
    gauges: dict[str, Any] = {}
    for key, value in body.items():
        if key in _LIST_GAUGES:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AdminInputError(f"{key} must be a list of adapter names")
            gauges[key] = tuple(value)
        elif key == "max_lora":
            if not isinstance(value, int) or isinstance(value, bool):
                raise AdminInputError("max_lora must be an integer")
            gauges[key] = value
        else:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise AdminInputError(f"{key} must be a number")
            gauges[key] = float(value)
    sim.set_gauges(**gauges)
    return {"pinned": sorted(gauges)}


def _clear(sim: AdminTarget) -> dict[str, Any]:
    sim.clear_overrides()
    return {"pinned": []}


def _health(sim: AdminTarget, body: Mapping[str, Any]) -> dict[str, Any]:
    healthy = body.get("healthy")
    if not isinstance(healthy, bool):
        raise AdminInputError('expected {"healthy": true|false}')
    sim.healthy = healthy
    return {"healthy": healthy}


def _black_hole(sim: AdminTarget, body: Mapping[str, Any]) -> dict[str, Any]:
    paths = body.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise AdminInputError('expected {"paths": ["/metrics", ...]} (absolute paths)')
    sim.black_hole(paths)
    return {"black_holed": sorted(sim.black_holed)}


def _received(sim: AdminTarget) -> list[dict[str, Any]]:
    return [
        {
            "method": r.method,
            "path": r.path,
            "headers": [list(h) for h in r.headers],
            "body": base64.b64encode(r.body).decode("ascii"),
            "http_version": r.http_version,
        }
        for r in sim.received_requests()
    ]
