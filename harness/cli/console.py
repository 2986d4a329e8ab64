"""Terminal output of the harness's commands (demo, bench, reports): progress bars and tables.

One place for ``rich`` so every command looks alike and degrades alike: on a terminal the progress
bar redraws in place; when the output is a pipe or a file (CI logs, tests) nothing animates and a
table is plain text with box-drawing rules. Tables take rows of already formatted strings; the
callers decide the number formats, these helpers only lay them out.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def console(stream: TextIO | None = None) -> Console:
    """A console on ``stream`` (stdout by default) that never wraps long table rows."""
    target = stream if stream is not None else sys.stdout
    # Not a terminal: wide enough that no table column is ever cut.
    return Console(file=target, soft_wrap=True, highlight=False, width=None if target.isatty() else 400)


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "right"  # "left" for names


def table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], caption: str = "") -> Table:
    # No outer padding or edge: every row starts at the line's first column (easy to grep).
    out = Table(
        title=escape(title),
        caption=escape(caption) or None,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        caption_justify="left",
        pad_edge=False,
        show_edge=False,
    )
    for column in columns:
        out.add_column(column.header, justify=column.justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        out.add_row(*(escape(cell) for cell in row))  # cells are text, never rich markup
    return out


def print_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    caption: str = "",
    out: Console | None = None,
) -> None:
    (out or console()).print(table(title, columns, rows, caption))


def table_text(
    title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], caption: str = ""
) -> str:
    """The table as plain text (for reports written to files)."""
    target = Console(width=400, record=True, file=io.StringIO(), soft_wrap=True, highlight=False)
    target.print(table(title, columns, rows, caption))
    return target.export_text()


class ProgressBar:
    """A labelled bar with counters (``ok 12  shed 3``) next to it; ``advance(**counts)`` per item."""

    def __init__(self, progress: Progress, label: str, total: int, counters: Sequence[str]) -> None:
        self._progress = progress
        self._counts = dict.fromkeys(counters, 0)
        self._task = progress.add_task(label, total=total, counts=self._counts_text())

    def advance(self, steps: int = 1, **counts: int) -> None:
        for name, value in counts.items():
            self._counts[name] = self._counts.get(name, 0) + value
        self._progress.update(self._task, advance=steps, counts=self._counts_text())

    def note(self, **values: str) -> None:
        """Replace the counter text by these values (a status line next to the bar)."""
        self._progress.update(self._task, counts="  ".join(f"{k} {v}" for k, v in values.items()))

    def _counts_text(self) -> str:
        return "  ".join(f"{name} {value:>4}" for name, value in self._counts.items())

    @property
    def counts(self) -> Mapping[str, int]:
        return dict(self._counts)


@contextlib.contextmanager
def progress_bar(
    label: str, total: int, *, counters: Sequence[str] = (), out: Console | None = None
) -> Iterator[ProgressBar]:
    """A live progress bar for one phase; it stays on screen (final state) when the block ends."""
    progress = Progress(
        TextColumn("  {task.description:<12}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=out or console(sys.stderr),
        transient=False,
    )
    with progress:
        yield ProgressBar(progress, label, total, counters)
