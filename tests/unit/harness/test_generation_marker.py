"""``--crd-release`` picks the session's API generation, and ``api_generation`` skips what belongs to
the other one, saying why (``harness.plugin.core``)."""

from __future__ import annotations

import pytest

from harness.cluster.releases import CRD_RELEASE_ENV

INNER_TESTS = """
import pytest

from harness.cluster.releases import session_generation

@pytest.mark.api_generation("v1alpha2")
def test_about_v0_3_crds():
    pass

@pytest.mark.api_generation("v1")
def test_about_v1_crds():
    pass

def test_any_generation():
    assert session_generation().name in ("v1alpha2", "v1")
"""


@pytest.mark.parametrize(
    ("release", "runs", "skipped"),
    [
        pytest.param("v0.3.0", "test_about_v0_3_crds", "test_about_v1_crds", id="v0.3.0-is-v1alpha2"),
        pytest.param("v1.5.0", "test_about_v1_crds", "test_about_v0_3_crds", id="v1.5.0-is-v1"),
    ],
)
def test_a_run_skips_the_other_generations_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, release: str, runs: str, skipped: str
) -> None:
    monkeypatch.setenv(CRD_RELEASE_ENV, "v1.2.0")  # the option wins over the environment (restored after)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rs", f"--crd-release={release}")
    result.assert_outcomes(passed=2, skipped=1)
    other = "v1" if release == "v0.3.0" else "v1alpha2"
    result.stdout.fnmatch_lines([f"*not applicable: written for API generation {other}, this run is *"])
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    passed = {r.nodeid.split("::")[1] for r in reports if r.passed and r.when == "call"}
    assert passed == {runs, "test_any_generation"}
    assert skipped not in passed
