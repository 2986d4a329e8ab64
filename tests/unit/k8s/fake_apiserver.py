"""A small in-memory Kubernetes API server (aiohttp.web on 127.0.0.1) for the watch-layer tests.

It serves list (with paging, label and `metadata.name` field selectors) and watch (JSON lines from
a recorded event history) for any namespaced collection path, and lets a test script the failures a
real server produces: 410 Gone as a status or as an ERROR event once history is compacted, a
connection dropped mid-stream, a watch that ends at once, 5xx answers, and BOOKMARK events.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.cluster import releases

JsonObject = dict[str, Any]

POD_PATH = "/api/v1/namespaces/ns1/pods"
GROUP_PREFIX = f"/apis/{releases.V1ALPHA2.pool_api_version}/namespaces/ns1"
POOL_PATH = f"{GROUP_PREFIX}/inferencepools"
MODEL_PATH = f"{GROUP_PREFIX}/inferencemodels"
# The v1 generation: InferencePool v1, and the optional kinds of the experimental group.
V1_POOL_PATH = f"/apis/{releases.V1.pool_api_version}/namespaces/ns1/inferencepools"
OBJECTIVE_PATH = f"{GROUP_PREFIX}/inferenceobjectives"
REWRITE_PATH = f"{GROUP_PREFIX}/inferencemodelrewrites"


@dataclass
class Request:
    verb: str  # "list", "watch", "create" or "replace"
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    peer_port: int = 0  # the client's port: one per connection


@dataclass
class _Event:
    rv: int
    type: str
    obj: JsonObject


@dataclass
class Collection:
    objects: dict[str, JsonObject] = field(default_factory=dict)
    history: list[_Event] = field(default_factory=list)
    compacted: int = 0  # a watch from a resourceVersion below this gets 410


class FakeApiServer:
    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.collections: dict[str, Collection] = {}
        self.requests: list[Request] = []
        self.rv = 100
        # Scripted failures, consumed one per request of that verb: "gone", "gone-event", "drop:<n>"
        # (close the connection after n events), "close" (end the watch at once), "once" (end the
        # watch cleanly after the first events it sends), "500", "hang"
        # (a watch that sends its headers and then nothing, ever: a half-open connection's view).
        self.list_faults: deque[str] = deque()
        self.watch_faults: deque[str] = deque()
        # Collections whose CRD is not installed (404 NotFound) or that RBAC forbids (403), for list
        # and watch alike, until the test takes them out again.
        self.absent: set[str] = set()
        self.forbidden: set[str] = set()
        self._ssl = ssl_context
        self._changed = asyncio.Event()
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> FakeApiServer:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._create)
        app.router.add_put("/{tail:.*}", self._replace)
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        self._notify()
        assert self._runner is not None
        await self._runner.cleanup()

    # --- state changes (recorded in the watch history) ----------------------------------------
    def upsert(self, path: str, obj: JsonObject, *, record: bool = True) -> JsonObject:
        coll = self.collections.setdefault(path, Collection())
        name = obj["metadata"]["name"]
        event_type = "MODIFIED" if name in coll.objects else "ADDED"
        stored = self._stamp(obj)
        coll.objects[name] = stored
        if record:
            coll.history.append(_Event(self.rv, event_type, stored))
        self._notify()
        return stored

    def delete(self, path: str, name: str, *, record: bool = True) -> None:
        coll = self.collections.setdefault(path, Collection())
        gone = coll.objects.pop(name)
        stored = self._stamp(gone)
        if record:
            coll.history.append(_Event(self.rv, "DELETED", stored))
        self._notify()

    def bookmark(self, path: str) -> int:
        """Advance the resourceVersion with nothing changed in `path`, and send a BOOKMARK for it."""
        self.rv += 1
        bookmark = {"kind": "Bookmark", "metadata": {"resourceVersion": str(self.rv)}}
        self.collections.setdefault(path, Collection()).history.append(_Event(self.rv, "BOOKMARK", bookmark))
        self._notify()
        return self.rv

    def raw_event(self, path: str, event_type: str, obj: JsonObject) -> None:
        """Send watchers an event as given, the cache untouched: a type no server sends today, say."""
        self.rv += 1
        obj = {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(self.rv)}}
        self.collections.setdefault(path, Collection()).history.append(_Event(self.rv, event_type, obj))
        self._notify()

    def compact(self, path: str) -> None:
        """Forget history: any watch from before now gets 410 Gone. Ends the open watches on `path`."""
        coll = self.collections.setdefault(path, Collection())
        self.rv += 1
        coll.compacted = self.rv
        coll.history.clear()
        self._notify()

    def watches(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.verb == "watch" and r.path == path]

    def lists(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.verb == "list" and r.path == path]

    def _stamp(self, obj: JsonObject) -> JsonObject:
        self.rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        return stored

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- HTTP ---------------------------------------------------------------------------------
    # --- single objects (the EPP's Lease): GET by name, POST to the collection, PUT with a resourceVersion
    async def _create(self, request: web.Request) -> web.Response:
        self._record("create", request)
        obj = await request.json()
        coll = self.collections.setdefault(request.path, Collection())
        if obj["metadata"]["name"] in coll.objects:
            return _status(409, "AlreadyExists", "already exists")
        return web.json_response(self.upsert(request.path, obj), status=201)

    async def _replace(self, request: web.Request) -> web.Response:
        self._record("replace", request)
        collection, _, name = request.path.rpartition("/")
        obj = await request.json()
        current = self.collections.setdefault(collection, Collection()).objects.get(name)
        if current is None:
            return _status(404, "NotFound", f"{name} not found")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified")
        return web.json_response(self.upsert(collection, obj))

    def _get_one(self, path: str) -> web.Response | None:
        """GET of one Lease (the only kind read by name); None for any other path (a collection)."""
        collection, _, name = path.rpartition("/")
        if not collection.endswith("/leases"):
            return None
        found = self.collections.setdefault(collection, Collection()).objects.get(name)
        if found is None:
            return _status(404, "NotFound", f"{name} not found")
        return web.json_response(found)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        one = self._get_one(request.path) if "watch" not in query else None
        if one is not None:
            return one
        watch = query.get("watch") in ("true", "1")
        self._record("watch" if watch else "list", request)
        faults = self.watch_faults if watch else self.list_faults
        fault = faults.popleft() if faults else ""
        if fault == "500":
            return _status(500, "InternalError", "scripted failure")
        if fault == "403" or request.path in self.forbidden:
            return _status(403, "Forbidden", 'pods is forbidden: User "x" cannot list')
        if request.path in self.absent:
            return _status(404, "NotFound", "the server could not find the requested resource")
        coll = self.collections.setdefault(request.path, Collection())
        if not watch:
            return self._list(coll, query)
        since = int(query.get("resourceVersion") or 0)
        if fault == "gone" or since < coll.compacted:
            if fault == "gone-event" or (fault != "gone" and self._gone_as_event):
                return await self._gone_event(request)
            return _status(410, "Expired", f"too old resource version: {since} ({coll.compacted})")
        if fault == "gone-event":
            return await self._gone_event(request)
        if fault == "hang":
            return await self._silent(request)
        return await self._watch(request, coll, query, since, fault)

    def _record(self, verb: str, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.requests.append(
            Request(verb, request.path, dict(request.query), dict(request.headers), peer[1] if peer else 0)
        )

    async def _silent(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        while not self._closing:
            changed = self._changed
            await changed.wait()
        return resp

    _gone_as_event = False

    def gone_as_event(self, on: bool = True) -> None:
        """Answer a too-old watch with 200 and an ERROR event (as kube-apiserver does) instead of 410."""
        self._gone_as_event = on

    def _list(self, coll: Collection, query: dict[str, str]) -> web.Response:
        items = sorted(
            (o for o in coll.objects.values() if _selected(o, query)), key=lambda o: o["metadata"]["name"]
        )
        offset = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items)
        page = items[offset : offset + limit]
        meta: JsonObject = {"resourceVersion": str(self.rv)}
        if offset + limit < len(items):
            meta["continue"] = str(offset + limit)
        return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page})

    async def _watch(
        self, request: web.Request, coll: Collection, query: dict[str, str], since: int, fault: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        drop_after = int(fault.split(":")[1]) if fault.startswith("drop:") else -1
        compacted_at_start = coll.compacted
        sent = 0
        while not self._closing and fault != "close":
            changed = self._changed
            for event in [e for e in coll.history if e.rv > since]:
                since = event.rv
                if event.type != "BOOKMARK" and not _selected(event.obj, query):
                    continue
                if event.type == "BOOKMARK" and query.get("allowWatchBookmarks") != "true":
                    continue
                await resp.write(json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n")
                sent += 1
                if sent == drop_after:
                    assert request.transport is not None
                    request.transport.close()  # mid-stream: no terminating chunk
                    return resp
            if coll.compacted != compacted_at_start or (fault == "once" and sent):
                break  # history compacted under this watch: end it, the client re-watches and gets 410
            await changed.wait()
        with contextlib.suppress(ConnectionResetError):  # the client may already have gone
            await resp.write_eof()
        return resp

    async def _gone_event(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                  "message": "too old resource version"}  # fmt: skip
        await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await resp.write_eof()
        return resp


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip
    return web.json_response(body, status=code)


def _selected(obj: JsonObject, query: dict[str, str]) -> bool:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    for term in filter(None, query.get("labelSelector", "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        k, _, v = term.partition("=")
        if k != "metadata.name":
            raise ValueError(f"unsupported field selector {k}")
        if meta.get("name") != v:
            return False
    return True
