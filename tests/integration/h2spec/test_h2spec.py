"""h2spec (the HTTP/2 conformance suite, built from Go modules and cached like the harness's other Go
binaries) against a real EPP process serving ext_proc over TLS: only the cases listed in
`expected_failures.txt`, each with its reason, may fail."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cluster import go_binaries
from harness.cluster.controlplane import ClusterAccess
from harness.subject.epp_process import EppProcess

pytestmark = pytest.mark.integration

EXPECTED = Path(__file__).with_name("expected_failures.txt")
METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def expected_failures() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for line in EXPECTED.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        package, case, why = (part.strip() for part in line.split(" | ", 2))
        assert why, f"{package} {case}: an expected failure needs its reason"
        out[(package, case)] = why
    return out


def outcomes(junit: Path) -> tuple[set[tuple[str, str]], int, int]:
    """(failed cases, cases run, cases passed) from h2spec's JUnit report."""
    failed: set[tuple[str, str]] = set()
    total = passed = 0
    for case in ET.parse(junit).iter("testcase"):
        total += 1
        kinds = {child.tag for child in case}
        if kinds & {"error", "failure"}:
            failed.add((case.get("package", ""), case.get("classname", "")))
        elif "skipped" not in kinds:
            passed += 1
    return failed, total, passed


def test_h2spec_fails_only_the_expected_cases(
    control_plane: ClusterAccess, namespace: str, tmp_path: Path
) -> None:
    h2spec = go_binaries.h2spec_path()
    kubeconfig = Path(control_plane.kubeconfig_path)
    with EppProcess(pool_name="h2spec-pool", pool_namespace=namespace, kubeconfig=kubeconfig) as epp:
        junit = tmp_path / "h2spec.xml"
        command = [str(h2spec), "-h", "127.0.0.1", "-p", str(epp.grpc_port), "-t", "-k", "-o", "3"]
        run = subprocess.run(
            [*command, "--path", METHOD, "-j", str(junit)], capture_output=True, text=True, timeout=240
        )
        assert epp.running, "the EPP did not survive h2spec"
    assert junit.exists(), (
        f"h2spec wrote no report (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr}"
    )
    failed, total, passed = outcomes(junit)
    expected = expected_failures()
    assert total >= 145, f"h2spec ran {total} cases"
    unexpected = sorted(failed - expected.keys())
    assert not unexpected, f"unexpected h2spec failures (see its output):\n{unexpected}\n{run.stdout[-6000:]}"
    fixed = sorted(expected.keys() - failed)
    assert not fixed, f"listed as expected failures but passed (remove them): {fixed}"
    assert passed >= total - len(expected) - 4  # 4 skipped: flow-control cases needing a response body
