"""A small asyncio client for the two calls a read-only controller makes: list and watch (plus the
get/create/replace of one object, for the leader-election Lease, the only thing the EPP writes).

Only what the informer needs: namespaced list (with paging) returning the collection's
resourceVersion, and a streaming watch (JSON lines, bookmarks on) yielding typed events. Failures are
typed (errors.py): a 410, as a status or as an ERROR event inside the stream, is `GoneError`, the
informer's cue to relist; a watch that reads nothing for `idle_timeout` is `WatchStalledError`.
aiohttp exceptions never leave this module untranslated.

Every request gets a connection of its own (no keep-alive pool). A pooled HTTP/1.1 connection can be
half-open — a peer or middlebox that went away without a FIN or RST — and nothing tells: TCP
keepalive does not help when the dead hop is a proxy that still ACKs, and HTTP/1.1 has no ping (the
reason client-go pings over HTTP/2). A fresh connection per request costs one TLS handshake per
watch renewal (about one a minute per kind) and per list page, and no request ever starts on a dead
connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace

from epp.k8s.config import KubeConfig
from epp.k8s.errors import ApiError, GoneError, KubeConnectionError, WatchStalledError

JsonObject = dict[str, Any]
ObjectList = list[JsonObject]

DEFAULT_REQUEST_TIMEOUT = 30.0
# The server ends a watch after this many seconds (timeoutSeconds); see the informer's liveness rule.
DEFAULT_WATCH_TIMEOUT = 60
DEFAULT_PAGE_SIZE = 500
# How long close() waits for connections a watch dropped mid-stream to finish closing (TLS shutdown).
CLOSE_GRACE = 5.0
USER_AGENT = "epp/0.1 (inference endpoint picker)"


@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced resource: `group` "" is the core API (`/api/v1`)."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str) -> str:
        """The collection's path in ``namespace``; ``""`` means every namespace (client-go's NamespaceAll)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if not namespace:
            return f"{prefix}/{self.plural}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


PODS = Resource("", "v1", "pods")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised, never yielded)."""

    type: str
    object: Mapping[str, Any]

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion", ""))


class KubeClient:
    """One aiohttp session to one API server; create inside the event loop, close when done."""

    def __init__(self, config: KubeConfig, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self._config = config
        self._request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        # Every connection not yet fully closed, from its creation to its connection_lost (then
        # forgotten: the books never grow past the connections open). aiohttp closes a connection
        # without waiting — after each response (force_close), when a watch is abandoned — and over
        # TLS the close_notify exchange still needs the loop; its connector's own close() waits only
        # for the connections still in use. `close()` waits for all of these, so an owner that closes
        # the loop next never leaves a half-closed socket to the garbage collector.
        self._open: dict[asyncio.Future[None], asyncio.Transport] = {}

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        if self._open:
            await asyncio.wait(set(self._open), timeout=CLOSE_GRACE)
        # Whatever is still closing has a peer that will not answer the TLS close: drop it.
        for closed, transport in list(self._open.items()):
            transport.abort()
            await asyncio.wait({closed}, timeout=CLOSE_GRACE)

    async def list(
        self,
        resource: Resource,
        namespace: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[ObjectList, str]:
        """All objects (following `continue` pages) and the list's resourceVersion to watch from."""
        params = _selectors(label_selector, field_selector)
        params["limit"] = str(page_size)
        items: ObjectList = []
        while True:
            page = await self._get_json(resource.path(namespace), params)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            resource_version = str(meta.get("resourceVersion", ""))
            if not meta.get("continue"):
                return items, resource_version
            params["continue"] = str(meta["continue"])

    async def watch(
        self,
        resource: Resource,
        namespace: str,
        resource_version: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = DEFAULT_WATCH_TIMEOUT,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Stream events after `resource_version` until the server ends the watch (after
        `timeout_seconds`, whole seconds, at least 1).

        A read that gets nothing for `idle_timeout` (default: twice `timeout_seconds`) raises
        `WatchStalledError`: a live server would have ended the watch by then. Close the stream with
        `contextlib.aclosing` when stopping early, so the connection is released.
        """
        timeout_seconds = max(1, int(timeout_seconds))
        idle = idle_timeout if idle_timeout is not None else 2.0 * timeout_seconds
        params = _selectors(label_selector, field_selector)
        params.update(
            watch="true",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout_seconds),
        )
        timeout = aiohttp.ClientTimeout(total=None, connect=self._request_timeout, sock_read=idle)
        url = self._config.server + resource.path(namespace)
        transport: asyncio.Transport | None = None
        try:
            async with self._session_get().get(url, params=params, timeout=timeout, **self._extra()) as resp:
                protocol = resp.connection.protocol if resp.connection is not None else None
                transport = protocol.transport if protocol is not None else None
                if resp.status != 200:
                    raise await _api_error(resp)
                pending = bytearray()
                async for chunk in resp.content.iter_any():
                    pending.extend(chunk)
                    while (end := pending.find(b"\n")) >= 0:
                        line = bytes(pending[:end])
                        del pending[: end + 1]
                        if line.strip():
                            yield _event(line)
                if pending.strip():
                    yield _event(bytes(pending))
        except aiohttp.SocketTimeoutError as exc:
            # The connection is dead: abort it rather than wait on a TLS close nobody will answer.
            if transport is not None:
                transport.abort()
            raise WatchStalledError(f"watch {url}: nothing read for {idle:g}s") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeConnectionError(f"watch {url}: {exc!r}") from exc

    def _opened(self, handler: ResponseHandler) -> None:
        """Follow a new connection until it has closed (see `_open`)."""
        closed = handler.closed  # None once the connection is fully gone
        if handler.transport is not None and closed is not None and not closed.done():
            self._open[closed] = handler.transport
            closed.add_done_callback(self._closed)

    def _closed(self, closed: asyncio.Future[None]) -> None:
        self._open.pop(closed, None)
        if not closed.cancelled():
            # A stream we walked away from ends in a TLS error (data after close_notify): expected.
            closed.exception()

    # --- the one kind the EPP writes: its leader-election Lease (epp.k8s.leader) -------------------
    async def get_object(self, path: str) -> JsonObject | None:
        """One object by its path; None when it does not exist (404)."""
        try:
            return await self._get_json(path, {})
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_object(self, collection_path: str, obj: Mapping[str, Any]) -> JsonObject:
        """POST; a name already taken is ApiError 409."""
        return await self._send_json("POST", collection_path, obj)

    async def replace_object(self, path: str, obj: Mapping[str, Any]) -> JsonObject:
        """PUT with the object's resourceVersion; someone else's write since is ApiError 409."""
        return await self._send_json("PUT", path, obj)

    async def _get_json(self, path: str, params: Mapping[str, str]) -> JsonObject:
        return await self._send_json("GET", path, None, params)

    async def _send_json(
        self, method: str, path: str, obj: Mapping[str, Any] | None, params: Mapping[str, str] | None = None
    ) -> JsonObject:
        url = self._config.server + path
        timeout = aiohttp.ClientTimeout(total=self._request_timeout)
        extra = self._extra()
        if obj is not None:
            extra["headers"] = {**extra.get("headers", {}), "Content-Type": "application/json"}
        payload = None if obj is None else json.dumps(obj).encode()
        try:
            async with self._session_get().request(
                method, url, params=params, data=payload, timeout=timeout, **extra
            ) as resp:
                if resp.status not in (200, 201):
                    raise await _api_error(resp)
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeConnectionError(f"{method} {url}: {exc!r}") from exc
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise KubeConnectionError(f"{method} {url}: response is not JSON") from exc
        if not isinstance(data, dict):
            raise KubeConnectionError(f"{method} {url}: response is not a JSON object")
        return data

    def _session_get(self) -> aiohttp.ClientSession:
        # Created on first use so the client can be constructed outside the event loop.
        if self._session is None:
            # force_close: a connection per request, never a pooled one that may be half-open
            # (module docstring).
            connector = _FollowedConnector(
                self._opened, ssl=self._config.ssl_context or True, force_close=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers={"Accept": "application/json", "User-Agent": USER_AGENT}
            )
        return self._session

    def _extra(self) -> dict[str, Any]:
        """Per-request keyword arguments: auth (re-read each time, tokens rotate) and SNI override."""
        extra: dict[str, Any] = {}
        auth = self._config.authorization()
        if auth:
            extra["headers"] = {"Authorization": auth}
        if self._config.tls_server_name:
            extra["server_hostname"] = self._config.tls_server_name
        return extra


class _FollowedConnector(aiohttp.TCPConnector):
    """A TCP connector that reports each connection it opens, so its close can be followed."""

    def __init__(self, on_open: Callable[[ResponseHandler], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_open = on_open

    async def _create_connection(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature, overridden)
    ) -> ResponseHandler:
        handler = await super()._create_connection(req, traces, timeout)
        self._on_open(handler)
        return handler


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _event(line: bytes) -> WatchEvent:
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise KubeConnectionError(f"watch stream carried a malformed line: {line[:200]!r}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("object"), dict):
        raise KubeConnectionError(f"watch stream carried a malformed event: {line[:200]!r}")
    event_type = str(raw.get("type", ""))
    obj: JsonObject = raw["object"]
    if event_type == "ERROR":
        raise _status_error(obj, code=int(obj.get("code") or 500))
    return WatchEvent(event_type, obj)


async def _api_error(resp: aiohttp.ClientResponse) -> ApiError:
    try:
        status = json.loads(await resp.read())
    except (ValueError, aiohttp.ClientError):
        status = None
    if not isinstance(status, dict):
        status = {"reason": resp.reason or ""}
    return _status_error(status, code=resp.status)


def _status_error(status: Mapping[str, Any], code: int) -> ApiError:
    """A metav1.Status (HTTP error body, or the object of an ERROR watch event) as a typed error."""
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or "")
    if code == 410:
        return GoneError(reason or "Gone", message)
    return ApiError(code, reason, message)


__all__ = [
    "PODS",
    "KubeClient",
    "Resource",
    "WatchEvent",
]
