"""Our EPP with one planted defect, for the black-box oracle's own test: pods being deleted stay routable.

Run as ``python -m tests.e2e.planted_epp`` with upstream's flag names (the test drives it through
`harness.subject.foreign_epp` in the upstream dialect, so the harness never learns of a ``/debug/datastore``:
its debug view is put on an ephemeral port nobody is told about, ``--debugPort=0``). The defect is
injected the way the product allows, through constructors: the pod reconciler reads pods through a
reader that forgets every ``deletionTimestamp`` (what upstream #713 did on resync); no product code
knows about it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from epp.api import NamespacedName, ObjectReader
from epp.config import ServerConfig
from epp.controller import PodReconciler
from epp.k8s import Controllers, KubeClient, load_config
from epp.k8s.controllers import Reconcile, Reconcilers
from epp.server.flags import parse_flags
from epp.server.runner import ControllersFactory, Epp
from harness.stress.planted import PodRewritingReader, never_deleting


def deletion_blind_pods(reader: ObjectReader, store: Any, pool: NamespacedName) -> Reconcile:
    """The production pod reconciler, reading pods through the defective reader (the store is the
    EPP's, as wired: never touched here)."""
    return PodReconciler(PodRewritingReader(reader, never_deleting), store).reconcile


async def serve(config: ServerConfig) -> int:
    async with KubeClient(load_config(config.kubeconfig, os.environ)) as client:
        pool = NamespacedName(config.pool_namespace, config.pool_name)

        controllers: ControllersFactory = lambda store: Controllers(  # noqa: E731
            client,
            store,
            pool,
            pool_group=config.pool_group,
            bookmark_interval=config.watch.bookmark_interval,
            reconcilers=Reconcilers(pod=deletion_blind_pods),
        )

        epp = Epp(config, registry=CollectorRegistry(), controllers=controllers)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, epp.request_stop)
        async with epp:
            await epp.wait()
    return 0


def main() -> int:
    flags = parse_flags([*sys.argv[1:], "--debugPort=0", "--shutdownDelay=0s"], os.environ)
    return asyncio.run(serve(flags.config))


if __name__ == "__main__":
    sys.exit(main())
