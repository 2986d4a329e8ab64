"""``harness up --with-epp``: the environment stays up, is reachable as printed, stops on Ctrl-C.

Two ways: the demo's pool, pods and models; or (``--pool``) only the EPP and Envoy for a pool that the
user applies with kubectl, the way to reproduce a bug by hand (README "Reproducing a bug by hand").
"""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import openai
import pytest

from harness.base.eventually import eventually
from harness.cluster.releases import session_generation

from .test_demo import MARKER_VAR, processes_with_marker

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
BASE_URL_PREFIX = "export OPENAI_BASE_URL="
REPO = Path(__file__).resolve().parents[2]
HARNESS = (sys.executable, "-m", "harness.cli")


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class Up:
    """A running ``harness up``: the lines it printed until the base URL, then the rest at the end."""

    def __init__(
        self, args: list[str], marker: str, harness: Sequence[str] = HARNESS, cwd: Path = REPO
    ) -> None:
        """``harness``: the command to run (by default this checkout's), started in ``cwd``."""
        self.process = subprocess.Popen(
            [*harness, "up", *args],
            env={**os.environ, MARKER_VAR: marker},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
        )
        assert self.process.stdout is not None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=_pump, args=(self.process.stdout, self.lines), daemon=True)
        self.reader.start()
        self.seen: list[str] = []

    def field(self, prefix: str) -> str:
        """The rest of the first printed line starting with ``prefix`` (waiting for it)."""
        for line in self.seen:
            if line.startswith(prefix):
                return line.removeprefix(prefix).strip()
        while True:
            line = self.lines.get(timeout=START_TIMEOUT_S)
            assert line is not None, "harness up exited before printing it:\n" + "".join(self.seen)
            self.seen.append(line)
            if line.startswith(prefix):
                return line.removeprefix(prefix).strip()

    def stop(self) -> str:
        """SIGINT, the exit status must be 0; everything it printed."""
        self.process.send_signal(signal.SIGINT)
        assert self.process.wait(timeout=STOP_TIMEOUT_S) == 0
        return self.output()

    def output(self) -> str:
        self.reader.join(timeout=10)
        rest = []
        while not self.lines.empty() and (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        return "".join(self.seen + rest)

    def kill(self) -> None:
        if self.process.poll() is None:  # only when an assertion failed: stop it the polite way first
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@contextmanager
def harness_up(*args: str, harness: Sequence[str] = HARNESS, cwd: Path = REPO) -> Iterator[tuple[Up, str]]:
    marker = uuid.uuid4().hex
    up = Up(list(args), marker, harness, cwd)
    try:
        yield up, marker
    finally:
        up.kill()


@pytest.mark.parametrize(
    ("epp", "launched_by"),
    [
        # EppProcess: the EPP line shows its metrics and its datastore view.
        pytest.param((), "http://", id="ours"),
        # The any-EPP launcher (harness.subject.foreign_epp), here with our EPP: what --epp-command CMD runs.
        # The EPP line names the command's EPP (an `up` that ignored the flag would show EppProcess's).
        pytest.param(("--epp-command", "ours"), "epp (ours): ", id="epp-command"),
    ],
)
def test_up_with_epp_serves_the_printed_base_url_until_sigint(epp: tuple[str, ...], launched_by: str) -> None:
    with harness_up("--with-epp", *epp) as (up, marker):
        assert up.field("EPP:").startswith(launched_by), up.field("EPP:")
        base_url = up.field(BASE_URL_PREFIX)
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
            completion = client.completions.create(model="food-review", prompt="Review: fine.", max_tokens=4)
        assert completion.model in {"food-review-1", "food-review-2"}
        assert completion.choices[0].text
        output = up.stop()
    assert "kubeconfig:" in output
    assert "kubectl:" in output
    assert "summaries-batch" in output
    assert processes_with_marker(marker) == [], output


def test_up_with_epp_for_a_pool_serves_what_kubectl_applies() -> None:
    """The by-hand loop: start it, apply the example with the printed command, send a request (the
    example of the session's API generation: the `harness up` subprocess inherits its CRD release)."""
    with harness_up("--with-epp", "--pool", "vllm-llama3-8b-instruct") as (up, marker):
        apply = shlex.split(up.field("apply:"))
        assert apply[-2:] == ["-f", session_generation().example_manifest]
        subprocess.run(apply, check=True, capture_output=True, text=True, cwd=REPO, timeout=60)
        base_url = up.field(BASE_URL_PREFIX)
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:

            def served() -> str:
                return client.completions.create(
                    model="food-review", prompt="Review: ok.", max_tokens=2
                ).model

            # The model is unknown (404) and then has no ready pod (503) until the Deployment is up.
            model = eventually(
                served,
                timeout=90,
                retry_on=(openai.NotFoundError, openai.InternalServerError),
                message="served",
            )
        assert model in {"food-review-1", "food-review-2"}
        output = up.stop()
    assert processes_with_marker(marker) == [], output


def test_up_deploy_installs_the_chart_and_serves_through_the_epp_pods() -> None:
    """``harness up --deploy``: the chart installed with helm, its EPP pods behind the printed Envoy."""
    with harness_up("--deploy", "--replicas", "1") as (up, marker):
        assert "vllm-llama3-8b-instruct" in up.field("chart:")
        assert up.field("EPP pods:").startswith("vllm-llama3-8b-instruct-epp-")
        base_url = up.field(BASE_URL_PREFIX).split()[0]
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
            completion = eventually(
                lambda: client.completions.create(model="food-review", prompt="Review: ok.", max_tokens=2),
                timeout=90, retry_on=(openai.NotFoundError, openai.InternalServerError), message="served",
            )  # fmt: skip
        assert completion.model in {"food-review-1", "food-review-2"}
        output = up.stop()
    assert processes_with_marker(marker) == [], output
