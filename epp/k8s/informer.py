"""List-then-watch for one resource in one namespace, keeping a parsed in-memory cache.

The reliability rules (DESIGN.md §2, client-go's reflector):
- list, then watch from the list's resourceVersion; every event and bookmark advances it, so a
  reconnect resumes exactly where the stream stopped;
- 410 Gone (status or ERROR event) relists, and objects missing from the new list are reported as
  DELETED, so a deletion that happened while disconnected is never lost;
- any other failure (refused, dropped mid-stream, 5xx, a watch that closes at once with nothing in
  it) reconnects after a capped, jittered exponential backoff, capped at 2 s so that a watch
  resumes within about 2 s of the API server coming back (three kinds retrying at most every
  2 s is nothing to an API server);
- liveness (DESIGN.md §6: a watch proves it is alive or is replaced within two bookmark
  intervals): each watch asks the server to end it after one `bookmark_interval` (timeoutSeconds,
  spread over +0..25% so replicas do not renew in step; 60 s by default, kube-apiserver's bookmark
  period). A live watch therefore shows a sign of life at least that often: an event, the bookmark
  kube-apiserver sends 2 s before the deadline when its cache has moved on, or the server ending
  the watch. A watch that reads nothing for two intervals is dead — typically a half-open
  connection, which no TCP-level check sees when the dead hop is a proxy that still ACKs — and is
  replaced at once, resuming from its resourceVersion (relisting only if that is gone). So a dead
  watch costs at most two intervals of staleness, where it used to cost a 330 to 630 s read timeout;
- the cache is updated before handlers run, so a reconciler triggered by an event reads at least
  that state;
- an optional kind (`optional=True`: InferenceObjective, InferenceModelRewrite) that is absent
  (404: no CRD) or forbidden (403: RBAC) never stops the EPP: the cache is emptied, the informer
  counts as synced, one warning is logged, and the list is tried again with `absent_backoff` (up to
  10 s apart), so a CRD installed or a permission granted later is picked up without a restart
  (upstream #1737 crash-looped; upstream looks only at start-up). A watch of it that fails so (the
  CRD deleted) relists, which lands in the same state;
- the resourceVersion is recorded after handlers run, so whoever reads `resource_version` == X
  knows every handler for every change up to X has already been called (the controllers' handlers
  enqueue keys, so those keys are already queued). The settle barrier depends on this order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from epp.api.types import NamespacedName
from epp.config import DEFAULT_WATCH_BOOKMARK_INTERVAL
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import KubeClient, Resource, WatchEvent
from epp.k8s.errors import ApiError, GoneError, KubeError, WatchStalledError

log = logging.getLogger(__name__)

T = TypeVar("T")

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"

DEFAULT_RECONNECT_BACKOFF = BackoffPolicy(initial=0.2, maximum=2.0, factor=2.0, jitter=0.2)
# How often an absent or forbidden optional kind is looked for again.
DEFAULT_ABSENT_BACKOFF = BackoffPolicy(initial=1.0, maximum=10.0, factor=2.0, jitter=0.2)
# The statuses that mean "this kind is not there for us": no CRD (404), no permission (403).
ABSENT_STATUSES = frozenset({403, 404})
# client-go's "very short watch": closed within this many seconds with no event is a failure.
MIN_HEALTHY_WATCH = 1.0
# Each watch's timeoutSeconds is the bookmark interval stretched by up to this fraction.
WATCH_TIMEOUT_SPREAD = 0.25
# A watch that reads nothing for this many bookmark intervals is dead.
STALLED_AFTER_INTERVALS = 2.0
LOG_EVERY_NTH_FAILURE = 10


@dataclass(frozen=True, slots=True)
class InformerEvent(Generic[T]):
    """A change to the cache. For DELETED, `obj` is the last state the cache held."""

    type: str
    key: NamespacedName
    obj: T


Handler = Callable[[InformerEvent[T]], None]
Sleep = Callable[[float], Awaitable[None]]
Parse = Callable[[Mapping[str, Any]], T]


class Informer(Generic[T]):
    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        namespace: str,
        parse: Parse[T],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        backoff: BackoffPolicy = DEFAULT_RECONNECT_BACKOFF,
        bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        optional: bool = False,
        absent_backoff: BackoffPolicy = DEFAULT_ABSENT_BACKOFF,
    ) -> None:
        self._client = client
        self._optional = optional
        self._absent_backoff = absent_backoff
        self._available = True  # False while an optional kind is absent or forbidden
        self._absent_attempts = 0
        self._resource = resource
        self._namespace = namespace
        self._parse = parse
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._backoff = backoff
        self._bookmark_interval = bookmark_interval
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._handlers: list[Handler[T]] = []
        # Written only by run() on the event loop; readers on the same loop see whole updates.
        self._cache: dict[NamespacedName, T] = {}
        self._resource_version = ""
        self._failures = 0
        self._synced = asyncio.Event()
        # For the debug view: relists after the first (410 Gone), watches replaced as dead.
        self._relists = 0
        self._stalled_watches = 0

    @property
    def name(self) -> str:
        return f"{self._resource.plural}/{self._namespace}"

    # --- reading ------------------------------------------------------------------------------
    def get(self, key: NamespacedName) -> T | None:
        return self._cache.get(key)

    def objects(self) -> Sequence[T]:
        return tuple(self._cache.values())

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion delivered (list, event or bookmark): where a reconnect resumes.

        Set only after the handlers of that change have run (see the module docstring).
        """
        return self._resource_version

    @property
    def resource(self) -> Resource:
        return self._resource

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def field_selector(self) -> str | None:
        return self._field_selector

    @property
    def label_selector(self) -> str | None:
        return self._label_selector

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def relists(self) -> int:
        """How many times the resourceVersion was gone (410) and the cache was relisted."""
        return self._relists

    @property
    def stalled_watches(self) -> int:
        """How many watches were replaced because they read nothing for two bookmark intervals."""
        return self._stalled_watches

    @property
    def optional(self) -> bool:
        return self._optional

    @property
    def available(self) -> bool:
        """False while an optional kind is absent (no CRD) or forbidden (RBAC): served without it."""
        return self._available

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def add_handler(self, handler: Handler[T]) -> None:
        """Register before `run`; called synchronously for every cache change, after the change."""
        self._handlers.append(handler)

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        """List and watch until cancelled."""
        await self._relist()
        while True:
            try:
                await self._watch_once()
            except GoneError as exc:
                log.info("%s: resourceVersion %s gone (%s): relist", self.name, self._resource_version, exc)
                self._relists += 1
                await self._relist()
            except WatchStalledError as exc:
                # Not the server's fault, nothing to back off from: watch again at once.
                self._stalled_watches += 1
                log.warning("%s: watch showed no sign of life (%s): replacing it", self.name, exc)
            except ApiError as exc:
                if not self._absent(exc):
                    await self._back_off(f"watch failed: {exc}")
                    continue
                # The optional kind went away (CRD deleted, permission revoked): the list says so.
                await self._relist()
            except KubeError as exc:
                await self._back_off(f"watch failed: {exc}")

    async def _watch_once(self) -> None:
        started = self._clock()
        received = False
        interval = self._bookmark_interval
        # Random spread of the server-side timeout, so replicas do not all re-watch at once; whole
        # seconds, rounded down, so the server always ends the watch well inside the idle limit.
        timeout = max(1, int(interval * (1.0 + WATCH_TIMEOUT_SPREAD * self._rng.random())))
        stream = self._client.watch(
            self._resource,
            self._namespace,
            self._resource_version,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=timeout,
            idle_timeout=STALLED_AFTER_INTERVALS * interval,
        )
        async with contextlib.aclosing(stream):
            async for event in stream:
                received = True
                self._failures = 0
                self._apply(event)
        # (Never as long as the watch was asked to last: a 1 s watch that ends after 1 s is healthy.)
        if not received and self._clock() - started < min(MIN_HEALTHY_WATCH, timeout / 2):
            await self._back_off("watch closed at once without events")

    async def _relist(self) -> None:
        while True:
            try:
                items, resource_version = await self._client.list(
                    self._resource, self._namespace, self._label_selector, self._field_selector
                )
            except ApiError as exc:
                if self._absent(exc):
                    await self._serve_without(exc)
                else:
                    await self._back_off(f"list failed: {exc}")
                continue
            except KubeError as exc:
                await self._back_off(f"list failed: {exc}")
                continue
            self._failures = 0
            if not self._available:
                log.info("%s: now served; watching it", self.name)
            self._available = True
            self._absent_attempts = 0
            self._replace(items, resource_version)
            self._synced.set()
            return

    def _absent(self, exc: ApiError) -> bool:
        return self._optional and exc.status in ABSENT_STATUSES

    async def _serve_without(self, exc: ApiError) -> None:
        """An optional kind is not there: empty cache, synced, one warning per outage, look again later."""
        if self._available:
            what = "not served (no CRD?)" if exc.status == 404 else "forbidden (RBAC?)"
            log.warning(
                "%s: %s: %s; serving without it, and looking again every %gs at most",
                self.name,
                what,
                exc,
                self._absent_backoff.maximum,
            )
        self._available = False
        self._replace((), "")
        self._synced.set()
        delay = self._absent_backoff.delay(self._absent_attempts, self._rng)
        self._absent_attempts += 1
        await self._sleep(delay)

    async def _back_off(self, why: str) -> None:
        delay = self._backoff.delay(self._failures, self._rng)
        # Retries come every 2 s at most while the API is away: warn on the first and every tenth.
        level = logging.WARNING if self._failures % LOG_EVERY_NTH_FAILURE == 0 else logging.DEBUG
        self._failures += 1
        log.log(level, "%s: %s; retrying in %.2fs (failure %d)", self.name, why, delay, self._failures)
        await self._sleep(delay)

    # --- cache updates ------------------------------------------------------------------------
    def _replace(self, items: Iterable[Mapping[str, Any]], resource_version: str) -> None:
        fresh: dict[NamespacedName, T] = {}
        for raw in items:
            parsed = self._parse_or_none(raw)
            if parsed is not None:
                fresh[_key(raw)] = parsed
        old, self._cache = self._cache, fresh
        events: list[InformerEvent[T]] = [
            InformerEvent(DELETED, key, obj) for key, obj in old.items() if key not in fresh
        ]
        for key, obj in fresh.items():
            if key not in old:
                events.append(InformerEvent(ADDED, key, obj))
            elif old[key] != obj:
                events.append(InformerEvent(MODIFIED, key, obj))
        for event in events:
            self._notify(event)
        # Only now: handlers first, then the version (see the module docstring).
        self._resource_version = resource_version

    def _apply(self, event: WatchEvent) -> None:
        self._dispatch(event)
        # After the handlers, never before: a reader that sees this version must find every key up
        # to it already queued. (A bookmark has no handlers; it only moves the version on.)
        if event.resource_version:
            self._resource_version = event.resource_version

    def _dispatch(self, event: WatchEvent) -> None:
        if event.type == BOOKMARK:
            return
        if event.type not in (ADDED, MODIFIED, DELETED):
            log.warning("%s: ignoring watch event of type %r", self.name, event.type)
            return
        key = _key(event.object)
        previous = self._cache.get(key)
        parsed = self._parse_or_none(event.object)
        if event.type == DELETED or parsed is None:
            # An object we cannot parse must not stay routable in its last good shape.
            self._cache.pop(key, None)
            last = parsed if parsed is not None else previous
            if last is not None and (previous is not None or event.type == DELETED):
                self._notify(InformerEvent(DELETED, key, last))
            return
        self._cache[key] = parsed
        self._notify(InformerEvent(ADDED if previous is None else MODIFIED, key, parsed))

    def _parse_or_none(self, raw: Mapping[str, Any]) -> T | None:
        try:
            return self._parse(raw)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("%s: cannot parse %s: %r", self.name, _key(raw), exc)
            return None

    def _notify(self, event: InformerEvent[T]) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                log.exception("%s: handler failed for %s %s", self.name, event.type, event.key)


def _key(raw: Mapping[str, Any]) -> NamespacedName:
    meta = raw.get("metadata") or {}
    return NamespacedName(str(meta.get("namespace", "")), str(meta.get("name", "")))
