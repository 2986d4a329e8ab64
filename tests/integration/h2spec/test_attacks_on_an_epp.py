"""The attack probes of `harness.stress.h2_attacks` pointed at a real EPP process's ext_proc port
(TLS, the ext_proc method, the EPP's own limits): each is stopped as it is by the in-process server,
and the EPP survives them all."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cluster.controlplane import ClusterAccess
from harness.stress import h2_attacks as a
from harness.subject.epp_process import EppProcess

pytestmark = pytest.mark.integration


def calm(outcome: a.Outcome) -> bool:
    return outcome.goaway == a.ENHANCE_YOUR_CALM and outcome.closed


# Those whose outcome does not depend on what the EPP's handler does with a request.
EXPECTED: dict[str, Callable[[a.Outcome], bool]] = {
    "rapid-reset": calm,
    "empty-continuation-flood": calm,
    "ping-flood-no-read": calm,
    # 17 MiB messages by default: four 4 MiB messages reserved, the others overran their windows.
    "buffer-pinning": lambda o: o.goaway is None and o.resets[a.FLOW_CONTROL_ERROR] > 0,
    "hpack-bomb": lambda o: o.goaway == a.COMPRESSION_ERROR and o.closed,
    "malformed-preface": lambda o: o.goaway == a.PROTOCOL_ERROR and o.closed,
}


def test_the_attacks_are_stopped_by_a_real_epp_and_it_survives_them(
    control_plane: ClusterAccess, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = Path(control_plane.kubeconfig_path)
    with EppProcess(pool_name="attacked-pool", pool_namespace=namespace, kubeconfig=kubeconfig) as epp:
        tls = ssl.create_default_context(cadata=epp.ext_proc_tls.ca_pem.decode())
        tls.set_alpn_protocols(["h2"])
        target = a.Target("127.0.0.1", epp.grpc_port, tls, server_name=epp.server_name)
        for name, expected in EXPECTED.items():
            outcome = asyncio.run(a.ATTACKS[name](target, 5.0))
            assert expected(outcome), f"{name}: {outcome}"
            assert epp.running, f"the EPP did not survive {name}"
        # The same from the command line.
        ca = tmp_path / "ca.crt"
        ca.write_bytes(epp.ext_proc_tls.ca_pem)
        port, name = str(epp.grpc_port), epp.server_name
        capsys.readouterr()
        a.main(["--port", port, "--ca", str(ca), "--server-name", name, "--only", "malformed-preface"])
        assert capsys.readouterr().out.split()[:2] == ["malformed-preface", f"goaway={a.PROTOCOL_ERROR}"]
        assert epp.running
