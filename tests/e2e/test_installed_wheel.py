"""The harness as another project uses it: built as a wheel, installed with the locked dependencies
into a fresh virtualenv, and run from a directory with no checkout in sight. The venv is kept in the
harness cache under a key of the wheel's files, the lock and the interpreter (`installed_venvs`): any
change to them installs anew.

What must work there: ``harness conformance`` on the scenarios the wheel carries (with its CI outputs),
``harness up --deploy`` with the chart the wheel carries, and a user's own test file that uses the
plugin's fixtures against our EPP. The Go-built binaries come from the harness cache, as they would on
a CI runner that restored it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import openai
import pytest

from harness.base.shipped import SHIPPED
from harness.cluster.crds import DEFAULT_CRD_RELEASE

from . import installed_venvs
from .test_up_with_epp import BASE_URL_PREFIX, harness_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600
# Two scenarios of different modules: enough to show collection from the wheel and the report.
SCENARIOS = "test_get_models_is_answered_by_a_pool_pod or test_unknown_model_is_404_with_a_message"
USER_TEST = """
import openai

def test_my_stack_routes_to_every_pod(stack_factory):
    stack = stack_factory(pods=2)
    verdict = stack.traffic.eventually_routes_to()
    assert verdict.consistent and len(verdict.expected) == 2, verdict
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    reply = client.completions.create(model="food-review", prompt="hi", max_tokens=1)
    assert reply.choices and reply.choices[0].text
"""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path  # an empty working directory, far from the checkout

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def run(self, *command: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(c) for c in command],
            cwd=self.elsewhere,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def clean_env() -> dict[str, str]:
    """The environment without anything that would put this checkout or its venv on the path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if str(REPO) not in p)
    return env


def _check(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, f"{what} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed-harness")
    wheels, elsewhere = root / "wheels", root / "elsewhere"
    elsewhere.mkdir()
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    run = Installed(Path(), Path(), elsewhere).run
    _check(run(*build, "--wheel-dir", wheels, REPO, timeout=INSTALL_TIMEOUT_S), "pip wheel")
    [wheel] = wheels.glob("inference_epp-*.whl")
    lock = REPO / "requirements" / "dev.txt"

    def install(venv: Path) -> None:
        pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _check(run(*pip, "--require-hashes", "-r", lock, timeout=INSTALL_TIMEOUT_S), "pip install the lock")
        _check(run(*pip, "--no-deps", wheel, timeout=INSTALL_TIMEOUT_S), "pip install the wheel")

    # A fresh venv per exact wheel, lock and interpreter, reused while they stay the same.
    venv = installed_venvs.cached_venv("harness-wheel", installed_venvs.input_key(wheel, lock), install)
    return Installed(wheel, venv, elsewhere)


def test_the_wheel_carries_the_scenarios_the_chart_the_examples_and_the_crd_pin(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    scenarios = {n for n in names if n.startswith("harness/scenarios/conformance/test_")}
    assert {Path(n).name for n in scenarios} >= {"test_any_epp.py", "test_openai_api.py", "test_kubectl.py"}
    for shipped in SHIPPED:
        assert any(
            n == f"harness/_shipped/{shipped}" or n.startswith(f"harness/_shipped/{shipped}/") for n in names
        )
    assert "harness/_shipped/deploy/chart/Chart.yaml" in names
    assert "harness/_shipped/examples/cluster/vllm-sim.yaml" in names
    # The CRD release the installed harness installs by default is the pinned one.
    pin = installed.run(
        installed.bin("python"),
        "-c",
        # Without the run's own choice (a --crd-release run exports it to what it starts).
        "import os; os.environ.pop('EPP_HARNESS_CRD_RELEASE', None); "
        "from harness.cluster import crds; print(crds.default_release())",
    )
    assert _check(pin, "reading the CRD pin").strip() == DEFAULT_CRD_RELEASE
    # Nothing is imported from the checkout.
    where = installed.run(
        installed.bin("python"), "-c", "import harness, epp; print(harness.__file__, epp.__file__)"
    )
    assert str(REPO) not in _check(where, "locating the installed packages")


def test_conformance_runs_the_shipped_scenarios_with_ci_reports(installed: Installed) -> None:
    junit, summary = installed.elsewhere / "junit.xml", installed.elsewhere / "summary.md"
    result = installed.run(
        installed.bin("harness"), "conformance", "--epp-command", "ours", "-n", "0", "-k", SCENARIOS,
        "--junit-xml", junit, "--summary-md", summary,
    )  # fmt: skip
    out = _check(result, "harness conformance")
    assert "EPP conformance" in out
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    assert sorted(c.get("name", "") for c in cases) == [
        "test_get_models_is_answered_by_a_pool_pod",
        "test_unknown_model_is_404_with_a_message",
    ]
    rows = [line for line in summary.read_text().splitlines() if line.startswith("| test_")]
    assert len(rows) == 2, summary.read_text()
    assert all("| pass |" in row for row in rows), summary.read_text()


def test_up_deploy_installs_the_shipped_chart(installed: Installed) -> None:
    with harness_up(
        "--deploy", "--replicas", "1", harness=(str(installed.bin("harness")),), cwd=installed.elsewhere
    ) as (
        up,
        _,
    ):
        base_url = up.field(BASE_URL_PREFIX).split()[0]
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
        try:
            reply = client.completions.create(model="food-review", prompt="hello", max_tokens=1)
        finally:
            client.close()
        assert reply.choices
        up.stop()


def test_a_user_test_file_runs_with_the_plugin_fixtures(installed: Installed) -> None:
    (installed.elsewhere / "test_user.py").write_text(USER_TEST)
    result = installed.run(
        installed.bin("python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"
    )
    out = _check(result, "the user's pytest")
    assert "1 passed" in out
