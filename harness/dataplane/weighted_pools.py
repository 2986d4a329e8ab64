"""One route split by weight across several InferencePools, each with its own EPP: what a gateway
makes of an HTTPRoute rule whose backendRefs are two weighted InferencePools (upstream's conformance
test GatewayWeightedAcrossTwoInferencePools, `conformance@v1.6.0`).

Envoy picks the pool when it resolves the route (the rule's `weighted_clusters`, one cluster per pool),
before any filter runs. The ext_proc filter then reads the picked cluster's own per-filter config
(`ClusterWeight.typed_per_filter_config` → `ExtProcPerRoute.overrides.grpc_service`), so each request
asks the EPP of the pool it is going to, and that pool's model-server cluster (ORIGINAL_DST, or the
list-aware cluster of that pool's endpoints) sends it where that EPP said. Without the per-cluster
override every request would ask one EPP: the split by weight still holds, but the other pool's
requests land on pods no EPP picked for them (a gateway bug reported against Istio's first
implementation of the test; `WeightedPoolsEnvoy(per_pool_epp=False)` reproduces it on purpose).

The first pool keeps `harness.dataplane.envoy`'s cluster names (`ext_proc`, `model_servers`), so
everything built for one pool (its endpoints file, the access log's fields) reads the same; the others
get the pool's name as a suffix. Each pool's endpoints file has a directory of its own, because Envoy
reloads a watched file on any rename into its directory.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from harness.cluster.certs import ExtProcTls
from harness.dataplane.envoy import (
    EXT_PROC_CLUSTER,
    MODEL_SERVERS_CLUSTER,
    Envoy,
    EnvoyOptions,
    ExtProcReplica,
    build_ext_proc_cluster,
    build_model_servers_cluster,
    ext_proc_service,
    model_server_endpoints_json,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*model_validator.*", category=DeprecationWarning)
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap
    from envoy_data_plane.envoy.config.route.v3 import (
        RouteConfiguration,
        WeightedCluster,
        WeightedClusterClusterWeight,
    )
    from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ExtProcOverrides, ExtProcPerRoute
    from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
        HttpConnectionManager,
    )
    from envoy_data_plane.google.protobuf import Any as AnyProto

EXT_PROC_FILTER: Final = "envoy.filters.http.ext_proc"
_MODEL_EDS_FILE: Final = "model_server_endpoints.json"


@dataclass(frozen=True)
class WeightedPool:
    """One backendRef of the rule: the pool's name, its weight, and its EPP ("ip:port", and the TLS
    Envoy verifies it with)."""

    name: str
    weight: int
    ext_proc: str
    ext_proc_tls: ExtProcTls | None = None


def pool_clusters(index: int, pool: WeightedPool) -> tuple[str, str]:
    """The (ext_proc, model servers) cluster names of the `index`-th pool: the single-pool names for
    the first, suffixed with the pool's name for the others."""
    if index == 0:
        return EXT_PROC_CLUSTER, MODEL_SERVERS_CLUSTER
    return f"{EXT_PROC_CLUSTER}-{pool.name}", f"{MODEL_SERVERS_CLUSTER}-{pool.name}"


def weighted_route(
    route_config: RouteConfiguration,
    pools: Sequence[WeightedPool],
    options: EnvoyOptions,
    *,
    per_pool_epp: bool,
) -> None:
    """Turn the single route's one cluster into the pools' weighted clusters, each (when
    `per_pool_epp`) naming its own EPP for the ext_proc filter."""
    clusters = []
    for index, pool in enumerate(pools):
        ext_proc_cluster, model_servers = pool_clusters(index, pool)
        per_filter = {}
        if per_pool_epp:
            override = ExtProcPerRoute(
                overrides=ExtProcOverrides(grpc_service=ext_proc_service(options, ext_proc_cluster))
            )
            per_filter[EXT_PROC_FILTER] = AnyProto.pack(override)
        clusters.append(
            WeightedClusterClusterWeight(
                name=model_servers, weight=pool.weight, typed_per_filter_config=per_filter
            )
        )
    [host] = route_config.virtual_hosts
    [route] = host.routes
    assert route.route is not None
    route.route.cluster = None
    route.route.weighted_clusters = WeightedCluster(clusters=clusters)


class WeightedPoolsEnvoy(Envoy):
    """An `Envoy` whose one route splits requests across `pools` by weight, each pool routed by its own
    EPP and sent to its own model-server cluster. With `options.follow_pool_endpoints`, each pool's
    endpoints are set with `set_pool_endpoints` (a `PoolEndpointsFollower` per pool)."""

    def __init__(
        self,
        pools: Sequence[WeightedPool],
        *,
        options: EnvoyOptions | None = None,
        per_pool_epp: bool = True,
    ) -> None:
        if len(pools) < 2:
            raise ValueError("a weighted route needs at least two pools")
        if len({pool.name for pool in pools}) != len(pools):
            raise ValueError(f"pool names must differ: {[pool.name for pool in pools]}")
        first = pools[0]
        super().__init__(first.ext_proc, options=options or EnvoyOptions(), ext_proc_tls=first.ext_proc_tls)
        self.pools = tuple(pools)
        self.per_pool_epp = per_pool_epp
        self._pool_eds_versions = [0] * len(pools)

    def pool_of_cluster(self, cluster: str) -> str | None:
        """The name of the pool whose model-server cluster is `cluster` (an access log's
        `upstream_cluster`), None for any other."""
        for index, pool in enumerate(self.pools):
            if pool_clusters(index, pool)[1] == cluster:
                return pool.name
        return None

    def set_pool_endpoints(self, pool_name: str, endpoints: Sequence[str]) -> None:
        """Replace pool `pool_name`'s model-server endpoints ("ip:port" each), as
        `Envoy.set_model_server_endpoints` does for a single pool."""
        if not self.options.follow_pool_endpoints:
            raise RuntimeError("this Envoy's model servers are not read from files")
        index = self._index(pool_name)
        if index == 0:
            self.set_model_server_endpoints(endpoints)
            return
        self._pool_eds_versions[index] += 1
        version = self._pool_eds_versions[index]
        cluster = pool_clusters(index, self.pools[index])[1]
        staged = self.dir / f".{cluster}.{version}"
        staged.write_text(model_server_endpoints_json(endpoints, version, cluster), encoding="utf-8")
        staged.replace(self._pool_eds_path(index))

    def _index(self, pool_name: str) -> int:
        for index, pool in enumerate(self.pools):
            if pool.name == pool_name:
                return index
        raise KeyError(f"no pool {pool_name!r} on this route: {[pool.name for pool in self.pools]}")

    def _pool_eds_path(self, index: int) -> Path:
        return self.dir / f"model-eds-{index}" / _MODEL_EDS_FILE

    def _build_bootstrap(self) -> Bootstrap:
        bootstrap = super()._build_bootstrap()
        resources = bootstrap.static_resources
        assert resources is not None
        options = self.options
        for index, pool in enumerate(self.pools[1:], start=1):
            ext_proc_name, model_servers_name = pool_clusters(index, pool)
            eds_path = None
            if options.follow_pool_endpoints:
                # The bootstrap names the file: it exists (empty) before Envoy reads the bootstrap.
                eds_path = self._pool_eds_path(index)
                eds_path.parent.mkdir(exist_ok=True)
                self.set_pool_endpoints(pool.name, ())
            resources.clusters.append(
                build_ext_proc_cluster(
                    options, [ExtProcReplica(pool.ext_proc)], pool.ext_proc_tls, name=ext_proc_name
                )
            )
            resources.clusters.append(build_model_servers_cluster(options, eds_path, model_servers_name))
        [listener] = resources.listeners
        [chain] = listener.filter_chains
        [network_filter] = chain.filters
        assert network_filter.typed_config is not None
        hcm = network_filter.typed_config.unpack()
        assert isinstance(hcm, HttpConnectionManager)
        assert hcm.route_config is not None
        weighted_route(hcm.route_config, self.pools, options, per_pool_epp=self.per_pool_epp)
        network_filter.typed_config = AnyProto.pack(hcm)
        return bootstrap
