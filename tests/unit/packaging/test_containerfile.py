"""The image's promises, read from the Containerfile itself (no container engine runs here)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from epp import config
from harness.nodeagent import containerfile

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def stages() -> list[containerfile.Stage]:
    return containerfile.read(ROOT / containerfile.CONTAINERFILE)


def test_multi_stage_with_a_slim_python_runtime(stages: list[containerfile.Stage]) -> None:
    assert len(stages) >= 2
    assert stages[-1].base.startswith("python:")
    assert "slim" in stages[-1].base


def test_final_stage_runs_the_epp_console_script_as_a_numeric_non_root_user(
    stages: list[containerfile.Stage],
) -> None:
    layout = containerfile.image_layout(stages)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert layout.entrypoint == ("epp",)
    assert "epp" in scripts
    assert layout.user is not None
    uid, _, gid = layout.user.partition(":")
    assert uid.isdigit(), layout.user
    assert int(uid) != 0, layout.user
    assert not gid or (gid.isdigit() and int(gid) != 0), layout.user


def test_exposes_the_epps_default_ports(stages: list[containerfile.Stage]) -> None:
    layout = containerfile.image_layout(stages)
    assert set(layout.exposed_ports) == {
        config.DEFAULT_GRPC_PORT,
        config.DEFAULT_GRPC_HEALTH_PORT,
        config.DEFAULT_METRICS_PORT,
    }


def test_final_stage_installs_offline_from_the_build_stage_only(stages: list[containerfile.Stage]) -> None:
    final = stages[-1]
    assert not final.all("COPY"), "the runtime stage copies nothing from the build context"
    runs = " ".join(i.arguments for i in final.all("RUN"))
    assert "--no-index" in runs
    for tool in ("gcc", "build-essential", "apt-get install"):
        assert tool not in runs


def test_dependencies_are_installed_from_the_lock_with_hashes(stages: list[containerfile.Stage]) -> None:
    build = " ".join(i.arguments for i in stages[0].all("RUN"))
    assert "--require-hashes -r requirements/epp.txt" in build


@pytest.mark.parametrize(
    ("text", "entrypoint", "user", "ports"),
    [
        pytest.param(
            'FROM a AS b\nRUN x\nFROM c\nARG U=7\nUSER ${U}:${U}\nEXPOSE 1 2/tcp\nENTRYPOINT ["e", "f"]\n',
            ("e", "f"), "7:7", (1, 2), id="arg-default-substituted",
        ),
        pytest.param(
            '# c\nFROM c\nRUN a \\\n  # inside\n  && b\nENTRYPOINT ["x"]\n', ("x",), None, (),
            id="continuations",
        ),
    ],
)  # fmt: skip
def test_parser_reads_the_final_stage(
    text: str, entrypoint: tuple[str, ...], user: str | None, ports: tuple[int, ...]
) -> None:
    layout = containerfile.image_layout(containerfile.parse(text))
    assert (layout.entrypoint, layout.user, layout.exposed_ports) == (entrypoint, user, ports)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("RUN x\n", id="no-from"),
        pytest.param("FROM a\nENTRYPOINT epp\n", id="shell-form-entrypoint"),
        pytest.param("FROM a\nRUN x \\\n", id="dangling-continuation"),
        pytest.param("FROM a\nRUN x\n", id="no-entrypoint"),
    ],
)
def test_parser_rejects_what_it_does_not_understand(text: str) -> None:
    with pytest.raises(containerfile.ContainerfileError):
        containerfile.image_layout(containerfile.parse(text))


def test_the_final_stages_env_is_read_in_order() -> None:
    text = 'FROM a AS b\nENV X=build\nFROM c\nENV A=1 B="two"\nENV C 3 4\nENTRYPOINT ["e"]\n'
    layout = containerfile.image_layout(containerfile.parse(text))
    assert layout.env == (("A", "1"), ("B", "two"), ("C", "3 4"))


def test_the_repository_containerfile_is_the_one_the_node_agent_runs() -> None:
    assert containerfile.repository_containerfile() == ROOT / containerfile.CONTAINERFILE
