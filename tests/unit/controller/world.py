"""A dict-backed ObjectReader and a tiny "world" that drives the real reconcilers with it.

The fake is type-checked against the `ObjectReader` Protocol (STYLE habit 1); objects enter it as
API JSON built with `harness.cluster.builders` and parsed with the same `from_api` the informers use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from epp.api import InferenceModel, InferencePool, NamespacedName, ObjectReader, PodObject
from epp.controller import ModelReconciler, PodReconciler, PoolReconciler
from epp.datastore import Datastore, new_datastore
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder

NS = "ns1"
POOL = "pool"
POOL_KEY = NamespacedName(NS, POOL)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


class FakeReader:
    def __init__(self) -> None:
        self.pools: dict[NamespacedName, InferencePool] = {}
        self.models: dict[NamespacedName, InferenceModel] = {}
        self.pods: dict[NamespacedName, PodObject] = {}

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        return self.pools.get(key)

    def get_model(self, key: NamespacedName) -> InferenceModel | None:
        return self.models.get(key)

    def list_models(self, namespace: str) -> Sequence[InferenceModel]:
        return [m for k, m in sorted(self.models.items()) if k.namespace == namespace]

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        return self.pods.get(key)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        return [
            p
            for k, p in sorted(self.pods.items())
            if k.namespace == namespace and all(p.labels.get(a) == b for a, b in selector.items())
        ]


class Listener:
    """Records pod lifecycle calls, as the prober's refresher manager would receive them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, NamespacedName]] = []

    def pod_added(self, key: NamespacedName, store: Datastore) -> None:
        self.calls.append(("added", key))

    def pod_removed(self, key: NamespacedName) -> None:
        self.calls.append(("removed", key))

    def pod_moved(self, key: NamespacedName, store: Datastore) -> None:
        self.calls.append(("moved", key))


class World:
    """Reader + real datastore + the three reconcilers for pool `ns1/pool`."""

    def __init__(self) -> None:
        self.fake = FakeReader()
        reader: ObjectReader = self.fake
        self.listener = Listener()
        self.store: Datastore = new_datastore(self.listener)
        self.pool_reconciler = PoolReconciler(reader, self.store, POOL_KEY)
        self.model_reconciler = ModelReconciler(reader, self.store, POOL_KEY)
        self.pod_reconciler = PodReconciler(reader, self.store)

    # --- the API side -------------------------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> NamespacedName:
        kind = obj["kind"]
        if kind == "InferencePool":
            pool = InferencePool.from_api(obj)
            self.fake.pools[pool.key] = pool
            return pool.key
        if kind == "InferenceModel":
            model = InferenceModel.from_api(obj)
            self.fake.models[model.key] = model
            return model.key
        pod = PodObject.from_api(obj)
        self.fake.pods[pod.key] = pod
        return pod.key

    def remove(self, key: NamespacedName) -> None:
        self.fake.pools.pop(key, None)
        self.fake.models.pop(key, None)
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
        if obj is None:
            assert key is not None
            self.remove(key)
        else:
            key = self.put(obj)
        self.model_reconciler.reconcile(key)

    # --- the datastore side -------------------------------------------------------------------
    def pod_addresses(self) -> dict[str, str]:
        return {pm.pod.key.name: pm.pod.address for pm in self.store.pod_get_all()}

    def model_owners(self) -> dict[str, str]:
        return {m.model_name: m.key.name for m in self.store.model_get_all()}


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
