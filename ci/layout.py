"""Print the harness's parts: modules and lines of each, and the import arrows between parts.

The README's Layout section shows this output; import-linter (pyproject.toml) holds the layering
itself. An arrow is one module of a part importing one module of another part; arrows within a part
are counted separately, since they are that part's own business.

    .venv/bin/python ci/layout.py
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"


def part_of(path: Path) -> str | None:
    """The part a module belongs to; None for ``harness/__init__.py``, which belongs to none."""
    relative = path.relative_to(HARNESS)
    return relative.parts[0] if len(relative.parts) > 1 else None


def imported_modules(path: Path) -> set[str]:
    """The harness modules ``path`` imports (absolute imports only: the harness uses no others)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("harness.")}


def main() -> int:
    lines: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    arrows: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in sorted(HARNESS.rglob("*.py")):
        part = part_of(path)
        if part is None:
            continue
        modules[part] += 1
        lines[part] += len(path.read_text().splitlines())
        for name in imported_modules(path):
            arrows[(part, name.split(".")[1])] += 1
    total = sum(lines.values())
    print(f"{'part':<11} {'modules':>7} {'lines':>6} {'share':>6}  imports (arrows to other parts)")
    for part in sorted(lines, key=lambda p: -lines[p]):
        out = {b: n for (a, b), n in arrows.items() if a == part and b != part}
        described = ", ".join(f"{b} {n}" for b, n in sorted(out.items(), key=lambda kv: -kv[1])) or "-"
        print(f"{part:<11} {modules[part]:>7} {lines[part]:>6} {lines[part] / total:>6.0%}  {described}")
    between = sum(n for (a, b), n in arrows.items() if a != b)
    within = sum(n for (a, b), n in arrows.items() if a == b)
    print(f"{len(lines)} parts, {total} lines; {between} arrows between parts, {within} within them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
