"""A dict-backed ObjectReader and a tiny "world" that drives the real reconcilers with it.

The fake is type-checked against the `ObjectReader` Protocol (STYLE habit 1); objects enter it as
API JSON built with `harness.cluster.builders` and parsed with the same `from_api` the informers use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from epp.api import (
    InferencePool,
    ModelRewrite,
    NamespacedName,
    Objective,
    ObjectReader,
    PodObject,
    v1,
    v1alpha2,
)
from epp.api.types import EndpointKey
from epp.controller import ObjectiveReconciler, PodReconciler, PoolReconciler, RewriteReconciler
from epp.datastore import Datastore, new_datastore
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder

NS = "ns1"
POOL = "pool"
POOL_KEY = NamespacedName(NS, POOL)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


class FakeReader:
    def __init__(self) -> None:
        self.pools: dict[NamespacedName, InferencePool] = {}
        self.objectives: dict[NamespacedName, Objective] = {}
        self.rewrites: dict[NamespacedName, ModelRewrite] = {}
        self.pods: dict[NamespacedName, PodObject] = {}

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        return self.pools.get(key)

    def get_objective(self, key: NamespacedName) -> Objective | None:
        return self.objectives.get(key)

    def list_objectives(self, namespace: str) -> Sequence[Objective]:
        return [o for k, o in sorted(self.objectives.items()) if k.namespace == namespace]

    def get_rewrite(self, key: NamespacedName) -> ModelRewrite | None:
        return self.rewrites.get(key)

    def list_rewrites(self, namespace: str) -> Sequence[ModelRewrite]:
        return [r for k, r in sorted(self.rewrites.items()) if k.namespace == namespace]

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        return self.pods.get(key)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        return [
            p
            for k, p in sorted(self.pods.items())
            if k.namespace == namespace and all(p.labels.get(a) == b for a, b in selector.items())
        ]


class Listener:
    """Records endpoint lifecycle calls, as the prober's refresher manager would receive them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, EndpointKey]] = []

    def pod_added(self, key: EndpointKey, store: Datastore) -> None:
        self.calls.append(("added", key))

    def pod_removed(self, key: EndpointKey) -> None:
        self.calls.append(("removed", key))

    def pod_moved(self, key: EndpointKey, store: Datastore) -> None:
        self.calls.append(("moved", key))


class World:
    """Reader + real datastore + the reconcilers for pool `ns1/pool`.

    Objects enter as API JSON of either generation, converted by the same functions the informers use
    (chosen here by apiVersion and kind).
    """

    def __init__(self) -> None:
        self.fake = FakeReader()
        reader: ObjectReader = self.fake
        self.listener = Listener()
        self.store: Datastore = new_datastore(self.listener)
        self.pool_reconciler = PoolReconciler(reader, self.store, POOL_KEY)
        self.rewrite_reconciler = RewriteReconciler(reader, self.store, POOL_KEY)
        self.objective_reconciler = ObjectiveReconciler(reader, self.store, POOL_KEY)
        self.pod_reconciler = PodReconciler(reader, self.store)

    # --- the API side -------------------------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> NamespacedName:
        kind, group = obj["kind"], str(obj.get("apiVersion", "")).partition("/")[0]
        if kind == "InferencePool":
            pool = v1.pool_from_api(obj) if group == v1.GROUP else v1alpha2.pool_from_api(obj)
            self.fake.pools[pool.key] = pool
            return pool.key
        if kind in ("InferenceModel", "InferenceModelRewrite"):
            rewrite = v1alpha2.model_from_api(obj) if kind == "InferenceModel" else v1.rewrite_from_api(obj)
            self.fake.rewrites[rewrite.key] = rewrite
            return rewrite.key
        if kind == "InferenceObjective":
            objective = v1.objective_from_api(obj)
            self.fake.objectives[objective.key] = objective
            return objective.key
        pod = PodObject.from_api(obj)
        self.fake.pods[pod.key] = pod
        return pod.key

    def remove(self, key: NamespacedName) -> None:
        self.fake.pools.pop(key, None)
        self.fake.rewrites.pop(key, None)
        self.fake.objectives.pop(key, None)
        self.fake.pods.pop(key, None)

    # --- events: put/remove then reconcile, as an informer + worker would -----------------------
    def pool_event(self, obj: dict[str, Any] | None = None, key: NamespacedName = POOL_KEY) -> None:
        if obj is None:
            self.remove(key)
        else:
            key = self.put(obj)
        self.pool_reconciler.reconcile(key)

    def pod_event(self, obj: dict[str, Any] | None = None, key: NamespacedName | None = None) -> None:
        if obj is None:
            assert key is not None
            self.remove(key)
        else:
            key = self.put(obj)
        self.pod_reconciler.reconcile(key)

    def model_event(self, obj: dict[str, Any] | None = None, key: NamespacedName | None = None) -> None:
        """An InferenceModel (v1alpha2) or InferenceModelRewrite (v1): both reach the rewrite reconciler."""
        if obj is None:
            assert key is not None
            self.remove(key)
        else:
            key = self.put(obj)
        self.rewrite_reconciler.reconcile(key)

    rewrite_event = model_event

    def objective_event(self, obj: dict[str, Any] | None = None, key: NamespacedName | None = None) -> None:
        if obj is None:
            assert key is not None
            self.remove(key)
        else:
            key = self.put(obj)
        self.objective_reconciler.reconcile(key)

    # --- the datastore side -------------------------------------------------------------------
    def pod_addresses(self) -> dict[str, str]:
        """Rank-0 endpoints by pod name (a single-port pool has no other)."""
        return {pm.pod.key.name: pm.pod.address for pm in self.store.pod_get_all() if pm.pod.key.rank == 0}

    def endpoints(self) -> list[str]:
        """Every endpoint as `pod@port`, sorted."""
        return sorted(f"{pm.pod.key.name}@{pm.pod.port}" for pm in self.store.pod_get_all())

    def model_owners(self) -> dict[str, str]:
        return {name: match.rewrite.key.name for name, match in self.store.rewrite_get_exact().items()}

    def objectives(self) -> dict[str, int | None]:
        return {o.key.name: o.priority for o in self.store.objective_get_all()}


def pool(
    selector: Mapping[str, str] | None = None, port: int = 8000, name: str = POOL, ns: str = NS
) -> PoolBuilder:
    return (
        PoolBuilder(name).namespace(ns).selector(selector or {"app": "vllm"}).port(port).extension_ref("epp")
    )


def pod(name: str, ip: str = "10.0.0.1", ns: str = NS, **labels: str) -> PodBuilder:
    return PodBuilder(name).namespace(ns).labels(labels or {"app": "vllm"}).ready(ip, at=T0)


def model(name: str, model_name: str, age_s: int = 0, pool_name: str = POOL, ns: str = NS) -> ModelBuilder:
    """`age_s` seconds after T0 (bigger = newer)."""
    return (
        ModelBuilder(name)
        .namespace(ns)
        .model_name(model_name)
        .pool(pool_name)
        .created_at(T0 + timedelta(seconds=age_s))
    )
