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
* ``binds-by-name``: objectives and rewrites bind by pool name whatever their group (upstream #1275);
* ``optional-kinds-looked-up-once``: an optional kind absent or forbidden at start is never looked
  for again (upstream's discovery at start-up, #1737).

A harness conformance run against it, e.g.::

    PYTHONPATH=$PWD EPP_PLANTED_DEFECT=ranks-never-forgotten .venv/bin/harness conformance \\
        --epp-command "$PWD/.venv/bin/python -m tests.e2e.planted_epp" --epp-flags v1 \\
        --epp-fixed-ports "" --crd-release v1.5.0 -k target_ports
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry

from epp.api import NamespacedName, ObjectReader
from epp.config import ServerConfig
from epp.controller import ObjectiveReconciler, PodReconciler, PoolReconciler, RewriteReconciler
from epp.k8s import Controllers, KubeClient, load_config
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.controllers import Reconcile, Reconcilers
from epp.server.flags import parse_flags
from epp.server.runner import ControllersFactory, Epp
from harness.stress.planted import (
    LyingReader,
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


DEFECTS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "deletion-blind": lambda: {"reconcilers": Reconcilers(pod=deletion_blind_pods)},
    "ranks-never-forgotten": lambda: {"reconcilers": ranks_never_forgotten()},
    "selector-blind": lambda: {"reconcilers": lying(lambda store: selector_blind(store.pool_get))},
    "binds-by-name": lambda: {"reconcilers": lying(lambda store: binds_by_name(store.pool_get))},
    "optional-kinds-looked-up-once": lambda: {"absent_backoff": NEVER_AGAIN},
}


async def serve(config: ServerConfig, defect: str) -> int:
    async with KubeClient(load_config(config.kubeconfig, os.environ)) as client:
        pool = NamespacedName(config.pool_namespace, config.pool_name)
        planted = DEFECTS[defect]()

        controllers: ControllersFactory = lambda store: Controllers(  # noqa: E731
            client,
            store,
            pool,
            pool_group=config.pool_group,
            bookmark_interval=config.watch.bookmark_interval,
            **planted,
        )

        epp = Epp(config, registry=CollectorRegistry(), controllers=controllers)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, epp.request_stop)
        async with epp:
            await epp.wait()
    return 0


def main() -> int:
    defect = os.environ.get(DEFECT_ENV) or "deletion-blind"
    if defect not in DEFECTS:
        print(f"{DEFECT_ENV}={defect!r}: one of {', '.join(DEFECTS)}", file=sys.stderr)
        return 2
    flags = parse_flags([*sys.argv[1:], "--debugPort=0", "--shutdownDelay=0s"], os.environ)
    return asyncio.run(serve(flags.config, defect))


if __name__ == "__main__":
    sys.exit(main())
