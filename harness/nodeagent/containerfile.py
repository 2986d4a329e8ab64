"""Read the EPP's ``Containerfile``: the one place its runtime layout (entrypoint, user, ports) lives.

No container engine runs here, so the image is never built on this machine. The harness still needs
what the image would do: the node agent runs an EPP pod as a local process with the image's
ENTRYPOINT and the container's args, and the tests check the image's promises (non-root, slim
final stage, the ports the EPP listens on). Reading them from the Containerfile instead of repeating
them keeps one source of truth.

Only the subset of the Dockerfile syntax the project uses is understood: comments, line
continuations, ``FROM ... AS name``, and instructions whose arguments are either a shell string or a
JSON exec-form array.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from harness.base.shipped import shipped_path

CONTAINERFILE: Final = "Containerfile"


class ContainerfileError(ValueError):
    """The file does not have the shape this reader understands."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    arguments: str  # the rest of the logical line, continuations joined

    def exec_form(self) -> list[str]:
        """The JSON array form (``ENTRYPOINT ["epp"]``); an error for the shell form."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError as exc:
            raise ContainerfileError(f"{self.keyword} is not in exec form: {self.arguments}") from exc
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ContainerfileError(f"{self.keyword} is not a JSON array of strings: {self.arguments}")
        return value


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: tuple[Instruction, ...] = field(default_factory=tuple)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass(frozen=True)
class ImageLayout:
    """What a container started from the final stage runs as."""

    entrypoint: tuple[str, ...]
    user: str | None
    exposed_ports: tuple[int, ...]
    env: tuple[tuple[str, str], ...] = ()  # the final stage's ENV lines, in order


def repository_containerfile() -> Path:
    """The Containerfile the harness ships: the checkout's, or the installed wheel's copy."""
    return shipped_path(CONTAINERFILE)


def parse(text: str) -> list[Stage]:
    """The build stages, in order, each with its instructions."""
    stages: list[Stage] = []
    base: str | None = None
    name: str | None = None
    current: list[Instruction] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: their defaults name the bases
    for instruction in _logical_lines(text):
        if instruction.keyword == "FROM":
            if base is not None:
                stages.append(Stage(base, name, tuple(current)))
            base, name = _from(_substitute(instruction.arguments, global_args))
            current = []
        elif base is None:
            if instruction.keyword != "ARG":  # only ARG may precede the first FROM
                raise ContainerfileError(f"{instruction.keyword} before the first FROM")
            key, _, default = instruction.arguments.partition("=")
            global_args[key.strip()] = _substitute(default.strip(), global_args)
        else:
            current.append(instruction)
    if base is None:
        raise ContainerfileError("no FROM instruction")
    stages.append(Stage(base, name, tuple(current)))
    return stages


def image_layout(stages: Sequence[Stage]) -> ImageLayout:
    """ENTRYPOINT, USER and EXPOSE of the final stage, with ``${ARG}`` defaults substituted."""
    final = stages[-1]
    args = {key: value for key, _, value in (i.arguments.partition("=") for i in final.all("ARG")) if value}
    entrypoint = final.last("ENTRYPOINT")
    if entrypoint is None:
        raise ContainerfileError("the final stage has no ENTRYPOINT")
    user = final.last("USER")
    ports: list[int] = []
    for expose in final.all("EXPOSE"):
        for token in expose.arguments.split():
            ports.append(int(token.split("/", 1)[0]))
    env: list[tuple[str, str]] = []
    for line in final.all("ENV"):
        env += _env_pairs(line.arguments)
    return ImageLayout(
        tuple(entrypoint.exec_form()),
        _substitute(user.arguments, args) if user is not None else None,
        tuple(ports),
        tuple(env),
    )


def _env_pairs(arguments: str) -> list[tuple[str, str]]:
    """``ENV A=1 B=2`` (unquoted values only, as this project writes them) or the legacy ``ENV A 1``."""
    words = arguments.split()
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ContainerfileError(f"cannot read ENV {arguments}")
        pairs.append((key, value.strip("\"'")))
    return pairs


def copy_sources(stage: Stage) -> list[tuple[str, str]]:
    """``(source, destination)`` of each COPY from the build context (not ``--from`` another stage)."""
    pairs = []
    for copy in stage.all("COPY"):
        words = copy.arguments.split()
        if any(w.startswith("--from") for w in words):
            continue
        if any(w.startswith("--") for w in words):
            raise ContainerfileError(f"unsupported COPY flags: {copy.arguments}")
        *sources, destination = words
        pairs += [(source, destination) for source in sources]
    return pairs


def read(path: Path) -> list[Stage]:
    return parse(path.read_text(encoding="utf-8"))


def _logical_lines(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        pending += line
        keyword, _, arguments = pending.strip().partition(" ")
        out.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    if pending:
        raise ContainerfileError("the file ends inside a continued line")
    return out


def _from(arguments: str) -> tuple[str, str | None]:
    words = [w for w in arguments.split() if not w.startswith("--")]
    if len(words) == 3 and words[1].upper() == "AS":
        return words[0], words[2]
    if len(words) == 1:
        return words[0], None
    raise ContainerfileError(f"cannot read FROM {arguments}")


def _substitute(value: str, args: dict[str, str]) -> str:
    for key, default in args.items():
        value = value.replace("${" + key + "}", default).replace("$" + key, default)
    return value
