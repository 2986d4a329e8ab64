"""Leader election over a coordination.k8s.io/v1 Lease (`--ha-enable-leader-election`, upstream #1264).

Beside our active-active default (every replica serves from its own watches, DESIGN.md §4), this is
upstream's HA mode: every replica keeps watching and probing, so it is warm, but only the holder of
the Lease reports SERVING; Envoy's health checks then send streams to the leader alone. The Lease is
`epp-<namespace>-<pool>.gateway-api-inference-extension.sigs.k8s.io` in the pool's namespace
(upstream-v1.md §b).

The rules are client-go's leaderelection, small:
- every `retry_period` the elector reads the Lease and decides (`decide`, pure): create it when
  there is none, renew it when it is ours, take it when its holder is empty or it has not changed for
  `lease_duration` as *we* observed it (our monotonic clock: no trust in other replicas' clocks),
  else wait;
- a leader that has not renewed for `renew_deadline` stops being leader (NOT_SERVING) before its
  Lease can expire for the others (renew_deadline < lease_duration), even while a call hangs;
- writes carry the resourceVersion read, so of two replicas taking an expired Lease only one wins
  (the other gets 409 Conflict);
- `release()` (on drain or stop) empties the holder, so the next replica takes over within one
  `retry_period` instead of a whole `lease_duration`: the leader's pod going away hands over at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from epp.api.types import NamespacedName
from epp.k8s.errors import KubeError

log = logging.getLogger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0

CREATE, RENEW, TAKE, WAIT = "create", "renew", "take", "wait"


def lease_name(pool: NamespacedName) -> str:
    return f"epp-{pool.namespace}-{pool.name}.gateway-api-inference-extension.sigs.k8s.io"


class LeaseClient(Protocol):
    """What the elector needs of `KubeClient`."""

    async def get_object(self, path: str) -> dict[str, Any] | None: ...

    async def create_object(self, collection_path: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_object(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    identity: str
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs an identity")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry_period < renew_deadline < lease_duration")


@dataclass(frozen=True, slots=True)
class Observed:
    """The Lease record as last read, and when (our monotonic clock) it last changed."""

    holder: str
    # (holder, renewTime, transitions, resourceVersion): a change of any is a sign of life.
    record: tuple[str, str, int, str]
    changed_at: float
    duration: float


def decide(lease: Mapping[str, Any] | None, me: str, observed: Observed | None, now: float) -> str:
    """What to do with the Lease as just read: CREATE, RENEW, TAKE or WAIT (pure, table-tested)."""
    if lease is None:
        return CREATE
    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
    if holder == me:
        return RENEW
    if not holder:
        return TAKE
    if (
        observed is not None
        and observed.record == _record(lease)
        and now - observed.changed_at >= observed.duration
    ):
        return TAKE
    return WAIT


def _record(lease: Mapping[str, Any]) -> tuple[str, str, int, str]:
    spec = lease.get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
        str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        client: LeaseClient,
        pool: NamespacedName,
        settings: LeaseSettings,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._settings = settings
        self._name = lease_name(pool)
        self._collection = LEASES.format(namespace=pool.namespace)
        self._path = f"{self._collection}/{self._name}"
        self._monotonic = monotonic
        self._wall = wall
        self._sleep = sleep
        self._observed: Observed | None = None
        self._leader = False
        self._renewed_at = 0.0  # monotonic time of our last successful write as leader
        self._released = False
        self._failing = False

    @property
    def is_leader(self) -> bool:
        """Holding the Lease, renewed within the renew deadline: a renewal stuck in a hung API call
        must not keep us SERVING after the others may take the Lease."""
        return self._leader and self._monotonic() - self._renewed_at < self._settings.renew_deadline

    @property
    def lease_name(self) -> str:
        return self._name

    async def run(self) -> None:
        """Try every retry_period until cancelled."""
        while True:
            await self.try_once()
            await self._sleep(self._settings.retry_period)

    async def try_once(self) -> None:
        if self._released:
            return
        now = self._monotonic()
        try:
            lease = await self._client.get_object(self._path)
            self._observe(lease, now)
            step = decide(lease, self._settings.identity, self._observed, now)
            if step == WAIT:
                self._failing = False
                self._set_leader(False)
                return
            await self._write(step, lease)
            self._failing = False
            self._renewed_at = now
            self._set_leader(True)
        except KubeError as exc:
            # Say it once per failure streak (RBAC without leases would otherwise be silent forever).
            log.log(logging.DEBUG if self._failing else logging.WARNING, "leader election: %s", exc)
            self._failing = True
            if self._leader and now - self._renewed_at >= self._settings.renew_deadline:
                log.warning(
                    "leader election: could not renew for %gs: %s", self._settings.renew_deadline, exc
                )
                self._set_leader(False)

    async def release(self) -> None:
        """Hand the Lease over at once (drain, stop); best effort. No taking it back afterwards."""
        self._released = True
        if not self._leader:
            return
        self._set_leader(False)
        try:
            lease = await self._client.get_object(self._path)
            if lease is None or _record(lease)[0] != self._settings.identity:
                return
            spec = dict(lease.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time(self._wall()))
            await self._client.replace_object(self._path, {**lease, "spec": spec})
            log.info("leader election: lease %s released", self._name)
        except KubeError as exc:
            log.warning("leader election: could not release lease %s: %s", self._name, exc)

    def _observe(self, lease: Mapping[str, Any] | None, now: float) -> None:
        if lease is None:
            self._observed = None
            return
        record = _record(lease)
        duration = float(
            (lease.get("spec") or {}).get("leaseDurationSeconds") or self._settings.lease_duration
        )
        if self._observed is None or self._observed.record != record:
            self._observed = Observed(record[0], record, now, duration)

    async def _write(self, step: str, lease: Mapping[str, Any] | None) -> None:
        stamp = _micro_time(self._wall())
        me = self._settings.identity
        duration = max(1, int(self._settings.lease_duration))
        if step == CREATE or lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name},
                "spec": {
                    "holderIdentity": me,
                    "leaseDurationSeconds": duration,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                    "leaseTransitions": 0,
                },
            }
            await self._client.create_object(self._collection, body)
            return
        spec = dict(lease.get("spec") or {})
        if step == TAKE:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = stamp
        spec.update(holderIdentity=me, leaseDurationSeconds=duration, renewTime=stamp)
        # The resourceVersion read goes back with the write: a concurrent taker gets 409.
        await self._client.replace_object(self._path, {**lease, "spec": spec})

    def _set_leader(self, leader: bool) -> None:
        if leader != self._leader:
            log.info("leader election: %s lease %s", "holding" if leader else "not holding", self._name)
        self._leader = leader
