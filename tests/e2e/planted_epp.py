"""Our EPP with one planted defect, for proving that a check can fail: the black-box oracle's own test
and the EPP-agnostic bug-class scenarios (`harness.scenarios.conformance`).

Run as ``python -m tests.e2e.planted_epp`` with upstream's flag names (the harness drives it through
`harness.subject.foreign_epp` in the upstream dialect, so it never learns of a ``/debug/datastore``:
its debug view is put on an ephemeral port nobody is told about, ``--debugPort=0``). The defect is
``$EPP_PLANTED_DEFECT`` (one of ``DEFECTS``; default ``deletion-blind``), injected the way the
product allows, through constructors (`Reconcilers`, `Controllers`); no product code knows about it:

* ``deletion-blind``: the pod reconciler forgets every ``deletionTimestamp`` (upstream #713 on resync);
* ``ranks-never-forgotten``: a pool's target ports only ever grow (upstream #2306);
* ``selector-blind``: every pod of the namespace is the pool's (two pools in one namespace);
* ``stale-resync``: a pool resync applies the pod list of the resync before (llm-d-router #2060);
* ``binds-by-name``: objectives and rewrites bind by pool name whatever their group (upstream #1275);
* ``optional-kinds-looked-up-once``: an optional kind absent or forbidden at start is never looked
  for again (upstream's discovery at start-up, #1737);
* ``follower-never-takes-over``: under ``--ha-enable-leader-election`` a replica that did not win the
  Lease at its first try never tries again (upstream's e2e "failover after leader deleted");
* ``no-drain``: SIGTERM stops at once, cutting the streams in flight (upstream #548).

Every other defect drains on SIGTERM as `epp.__main__` does.

A harness conformance run against it, e.g.::

    PYTHONPATH=$PWD EPP_PLANTED_DEFECT=ranks-never-forgotten .venv/bin/harness conformance \\
        --epp-command "$PWD/.venv/bin/python -m tests.e2e.planted_epp" --epp-flags v1 \\
        --epp-fixed-ports "" --crd-release v1.5.0 -k target_ports
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry

from epp.api import NamespacedName, ObjectReader
from epp.config import ServerConfig
from epp.controller import ObjectiveReconciler, PodReconciler, PoolReconciler, RewriteReconciler
from epp.k8s import Controllers, KubeClient, load_config
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.controllers import Reconcile, Reconcilers
from epp.k8s.leader import LeaderElector, LeaseSettings
from epp.server.flags import parse_flags
from epp.server.runner import DEFAULT_SHUTDOWN_GRACE, ControllersFactory, Epp, LeaderElectorLike
from harness.stress.planted import (
    LyingReader,
    OneListBehind,
    PodRewritingReader,
    RanksNeverForgotten,
    binds_by_name,
    never_deleting,
    selector_blind,
)

DEFECT_ENV: Final = "EPP_PLANTED_DEFECT"
# Upstream's discovery looks once, at start-up: "again" is never within any test's patience.
NEVER_AGAIN: Final = BackoffPolicy(initial=1e9, maximum=1e9, jitter=0.0)


def deletion_blind_pods(reader: ObjectReader, store: Any, pool: NamespacedName) -> Reconcile:
    """The production pod reconciler, reading pods through the defective reader (the store is the
    EPP's, as wired: never touched here)."""
    return PodReconciler(PodRewritingReader(reader, never_deleting), store).reconcile


def lying(make_lies: Callable[[Any], dict[str, Any]]) -> Reconcilers:
    """Every production reconciler, each reading through a `LyingReader` built from the store's pool."""

    def reader_of(reader: ObjectReader, store: Any) -> LyingReader:
        return LyingReader(reader, **make_lies(store))

    return Reconcilers(
        pool=lambda r, s, p: PoolReconciler(reader_of(r, s), s, p).reconcile,
        objective=lambda r, s, p: ObjectiveReconciler(reader_of(r, s), s, p).reconcile,
        rewrite=lambda r, s, p: RewriteReconciler(reader_of(r, s), s, p).reconcile,
        pod=lambda r, s, p: PodReconciler(reader_of(r, s), s).reconcile,
    )


def ranks_never_forgotten() -> Reconcilers:
    lie = RanksNeverForgotten()  # one memory for the EPP's life, as a stale endpoint map was
    return lying(lambda _store: {"pool": lie})


def stale_resync() -> Reconcilers:
    lists = OneListBehind()  # the pool reconciler's memory: only resyncs list pods
    return dataclasses.replace(
        Reconcilers(), pool=lambda r, s, p: PoolReconciler(LyingReader(r, pod_list=lists), s, p).reconcile
    )


DEFECTS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "deletion-blind": lambda: {"reconcilers": Reconcilers(pod=deletion_blind_pods)},
    "ranks-never-forgotten": lambda: {"reconcilers": ranks_never_forgotten()},
    "selector-blind": lambda: {"reconcilers": lying(lambda store: selector_blind(store.pool_get))},
    "stale-resync": lambda: {"reconcilers": stale_resync()},
    "binds-by-name": lambda: {"reconcilers": lying(lambda store: binds_by_name(store.pool_get))},
    "optional-kinds-looked-up-once": lambda: {"absent_backoff": NEVER_AGAIN},
}
# Defects planted outside the controllers (the elector, the shutdown): see `serve`.
ELSEWHERE: Final = ("follower-never-takes-over", "no-drain")


class TriesOnce:
    """A `LeaderElectorLike` that tries for the Lease once: the winner renews it as usual, a loser
    waits for good instead of taking over when the leader goes."""

    def __init__(self, inner: LeaderElector) -> None:
        self._inner = inner

    @property
    def is_leader(self) -> bool:
        return self._inner.is_leader

    async def run(self) -> None:
        await self._inner.try_once()
        if self._inner.is_leader:
            await self._inner.run()
        await asyncio.Event().wait()  # until cancelled

    async def release(self) -> None:
        await self._inner.release()


def elector(config: ServerConfig, client: KubeClient, defect: str) -> LeaderElectorLike | None:
    """The production elector (as `Epp` builds it from the flags), or the defect's."""
    election = config.leader_election
    if not election.enabled:
        return None
    identity = election.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    settings = LeaseSettings(
        identity, election.lease_duration, election.renew_deadline, election.retry_period
    )
    inner = LeaderElector(client, NamespacedName(config.pool_namespace, config.pool_name), settings)
    return TriesOnce(inner) if defect == "follower-never-takes-over" else inner


async def serve(config: ServerConfig, defect: str) -> int:
    async with KubeClient(load_config(config.kubeconfig, os.environ)) as client:
        pool = NamespacedName(config.pool_namespace, config.pool_name)
        planted = DEFECTS.get(defect, dict)()

        controllers: ControllersFactory = lambda store: Controllers(  # noqa: E731
            client,
            store,
            pool,
            pool_group=config.pool_group,
            bookmark_interval=config.watch.bookmark_interval,
            **planted,
        )

        epp = Epp(
            config,
            registry=CollectorRegistry(),
            controllers=controllers,
            leader_elector=elector(config, client, defect),
            # no-drain: nothing in flight is waited for (stop() otherwise gives streams a grace).
            shutdown_grace=0.0 if defect == "no-drain" else DEFAULT_SHUTDOWN_GRACE,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, epp.request_stop)
        async with epp:
            await epp.wait()
            if defect != "no-drain":
                await epp.drain()
    return 0


def main() -> int:
    defect = os.environ.get(DEFECT_ENV) or "deletion-blind"
    if defect not in DEFECTS and defect not in ELSEWHERE:
        print(f"{DEFECT_ENV}={defect!r}: one of {', '.join([*DEFECTS, *ELSEWHERE])}", file=sys.stderr)
        return 2
    flags = parse_flags([*sys.argv[1:], "--debugPort=0", "--shutdownDelay=0s"], os.environ)
    return asyncio.run(serve(flags.config, defect))


if __name__ == "__main__":
    sys.exit(main())
