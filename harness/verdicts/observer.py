"""The observation side of a test: what the EPP holds, checked against the API server.

Everything comes from outside the EPP, through the doors production has: its ``/debug/datastore``
view (the datastore, the applied resourceVersions, idle work queues) and the API server's objects. The
consistency oracle (``harness.verdicts.oracle``) says what the datastore must hold; the settle barrier
(``harness.verdicts.settle``) says when the EPP has seen the test's latest writes, so that a check after it —
"nothing changed" included — is about a datastore that has applied them. The same observer serves
the in-process EPP (``TestBed``) and the EPP process (``Stack``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from harness.base.eventually import eventually
from harness.cluster.kube import Kube
from harness.verdicts.oracle import Verdict, compare, expected_from_api, observed_state
from harness.verdicts.settle import SettleBarrier

View = dict[str, Any]

# `set_gauges` keyword -> the key of a pod's metrics in the EPP's /debug/datastore view.
VIEW_KEYS: Final = {
    "waiting": "waitingQueueSize",
    "running": "runningQueueSize",
    "kv_cache": "kvCacheUsagePercent",
    "running_loras": "activeModels",
    "waiting_loras": "waitingModels",
    "max_lora": "maxActiveModels",
}


class EppObserver:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        pool_name: str,
        barrier: SettleBarrier,
        read_view: Callable[[], View],
    ) -> None:
        """``read_view``: the EPP's ``/debug/datastore`` document.

        (``harness.subject.epp_probe.datastore_view``)
        """
        self.kube = kube
        self.namespace = namespace
        self.pool_name = pool_name
        self.barrier = barrier
        self._read_view = read_view

    # ------------------------------------------------------------------ what the EPP holds
    def view(self) -> View:
        """The EPP's /debug/datastore document."""
        return self._read_view()

    def datastore_pods(self) -> dict[str, str]:
        """Pods the EPP holds: name -> address (names alone; ``verdict()`` compares with namespaces)."""
        return {p["name"]: p["address"] for p in self.view()["pods"]}

    def datastore_models(self) -> dict[str, str]:
        """Models the EPP holds: modelName -> the owning object's name."""
        return {m["modelName"]: m["name"] for m in self.view()["models"]}

    def pod_view(self, name: str) -> dict[str, Any] | None:
        """This namespace's pod ``name`` as the datastore view shows it (metrics and their age), or None."""
        return next(
            (p for p in self.view()["pods"] if p["namespace"] == self.namespace and p["name"] == name), None
        )

    def eventually_gauges(self, name: str, timeout: float = 10.0, **gauges: Any) -> dict[str, Any]:
        """Wait until the view shows, for pod ``name``, the gauges given (``set_gauges`` keywords).

        Routing on pinned gauges is only meaningful once a scrape carried them into the datastore.
        Returns the pod's view entry.
        """
        unknown = set(gauges) - set(VIEW_KEYS)
        if unknown:
            raise TypeError(f"unknown gauges: {sorted(unknown)}")

        def check() -> dict[str, Any]:
            pod = self.pod_view(name)
            assert pod is not None, f"pod {name} not in the datastore"
            metrics = pod["metrics"]
            for gauge, want in gauges.items():
                got = metrics[VIEW_KEYS[gauge]]
                if isinstance(want, (list, tuple, set, frozenset)):
                    assert sorted(got) == sorted(want), f"{name}.{gauge}: datastore has {got}, want {want}"
                else:
                    assert math.isclose(got, want), f"{name}.{gauge}: datastore has {got}, want {want}"
            return pod

        return eventually(check, timeout=timeout, message=f"gauges of {name} scraped")

    def eventually_scraped(self, timeout: float = 10.0) -> View:
        """Wait until every pod the EPP holds has been scraped at least once (a routing decision is
        then made on real metrics: a pod never scraped is not fresh, so it is not a candidate)."""

        def check() -> View:
            view = self.view()
            unscraped = [p["name"] for p in view["pods"] if p.get("metricsAgeSeconds") is None]
            assert not unscraped, f"not scraped yet: {unscraped}"
            return view

        return eventually(check, timeout=timeout, message="the EPP scraped every pod it holds")

    def eventually_stale(self, name: str, threshold: float, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until pod ``name``'s metrics are older than ``threshold`` (the EPP's staleness threshold)."""

        def check() -> dict[str, Any]:
            pod = self.pod_view(name)
            assert pod is not None, f"pod {name} not in the datastore"
            age = pod["metricsAgeSeconds"]
            assert age is None or age > threshold, f"{name}: metrics {age:.2f}s old, threshold {threshold}s"
            return pod

        return eventually(check, timeout=timeout, message=f"metrics of {name} stale")

    # ------------------------------------------------------------------ the oracle
    def verdict(self) -> Verdict:
        expected = expected_from_api(self.kube, self.namespace, self.pool_name)
        return compare(expected, observed_state(self.view()))

    def eventually_consistent(self, timeout: float = 15.0) -> Verdict:
        """Settle (``settled()``), then wait until the datastore agrees with the API server.

        Settling first makes this a sound step for negative checks too: a write that must change
        nothing passes only once the EPP has applied it, not merely because it had not looked yet.
        """
        self.settled(timeout=timeout)

        def check() -> Verdict:
            verdict = self.verdict()
            assert verdict.consistent, verdict.summary()
            return verdict

        return eventually(check, timeout=timeout, message="datastore consistent with the API server")

    # ------------------------------------------------------------------ the settle barrier
    def settled(self, timeout: float = 15.0, *, at: Mapping[str, str | int] | None = None) -> View:
        """Wait until the EPP has applied the latest recorded write of each kind it can see, and is idle.

        ``at`` adds resourceVersions written some other way (kubectl), per kind plural ("pods",
        "inferencemodels", "inferencepools"). Returns the view that showed the EPP settled. Call it
        before any "X did not happen" check (STYLE habit 20).
        """
        return self.barrier.wait(self._read_view, at=at, timeout=timeout)
