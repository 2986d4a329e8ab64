"""A cluster of its own for control-plane fault tests: break it without breaking anyone else's.

The shared control plane serves every test of a run at once, so nothing may restart it. A `FaultRig`
starts its own full plane (etcd, kube-apiserver, scheduler, controller-manager, node agent, CRDs), a
`TcpProxy` in front of the API server, and a `TestBed` whose in-process EPP reaches the API server
only through that proxy (its kubeconfig names the proxy's port; the API server's certificate is for
127.0.0.1, so TLS verifies as usual), while the test's own writes go straight to the API server.
Faults then come from real processes and a real network path: `rig.plane.restart_apiserver()`,
`restart_etcd()`, `compact_etcd()`, `rig.proxy.freeze()` (half-open connections),
`cut()`/`restore()` (a partition).

The EPP's watch liveness interval (`--watchBookmarkInterval`) is short here (2 s), so a dead watch
is replaced within seconds instead of the production two minutes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from harness.base.lifecycle import StartStop
from harness.base.ports import LOOPBACK
from harness.base.process import temp_prefix
from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ControlPlane
from harness.cluster.namespaces import TEST_LABEL, create_namespace
from harness.dataplane.tcp_proxy import TcpProxy

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_WATCH_BOOKMARK_INTERVAL_S = 2.0
DEFAULT_NAMESPACE = "faults"


class FaultRig(StartStop):
    """Its own plane, a proxy between the EPP and the API server, and a TestBed; see the module docstring."""

    def __init__(
        self,
        *,
        apiserver_args: Sequence[str] = (),
        watch_bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL_S,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        """`apiserver_args`: extra kube-apiserver flags, e.g. ``--watch-cache-sizes=pods#0``."""
        self.namespace = namespace
        self.watch_bookmark_interval = watch_bookmark_interval
        self.plane = ControlPlane(extra_apiserver_args=apiserver_args)
        self.proxy: TcpProxy | None = None
        self._bed: TestBed | None = None
        self._api: ApiClient | None = None
        self._dir: Path | None = None

    @property
    def bed(self) -> TestBed:
        if self._bed is None:
            raise RuntimeError("the rig is not started")
        return self._bed

    def _start(self) -> None:
        self.plane.start()
        self._dir = Path(tempfile.mkdtemp(prefix=temp_prefix("faults")))
        server_port = int(self.plane.server_url.rsplit(":", 1)[1])
        self.proxy = TcpProxy(LOOPBACK, server_port).start()
        kubeconfig = self._dir / "epp-kubeconfig"
        _redirect_kubeconfig(self.plane.kubeconfig_path, kubeconfig, f"https://{self.proxy.address}")
        self._api = self.plane.api_client()
        create_namespace(self._api, self.namespace, TEST_LABEL)
        self._bed = TestBed(
            self._api, self.namespace, kubeconfig, watch_bookmark_interval=self.watch_bookmark_interval
        )

    def stop(self) -> None:
        """The TestBed (EPP, simulators), the proxy, the plane, the temp dir. Idempotent."""
        try:
            if self._bed is not None:
                self._bed.close()
                self._bed = None
        finally:
            try:
                if self._api is not None:
                    self._api.close()  # type: ignore[no-untyped-call]
                    self._api = None
                if self.proxy is not None:
                    self.proxy.stop()
                    self.proxy = None
            finally:
                self.plane.stop()
                if self._dir is not None:
                    shutil.rmtree(self._dir, ignore_errors=True)
                    self._dir = None


def _redirect_kubeconfig(source: Path, target: Path, server_url: str) -> None:
    """A copy of `source` (same identity, same CA) whose cluster is reached at `server_url`."""
    config = yaml.safe_load(source.read_text(encoding="utf-8"))
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server_url
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    target.chmod(0o600)
