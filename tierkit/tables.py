"""Plain-text tables for the demo's report: what a person reads, where a dict dump was.

Columns are as wide as their widest cell; the first (the row's name) aligns left and the rest
right, so that figures line up on their last digit.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``title`` over a header line and one line per row, indented two spaces under it."""
    cells = [[str(value) for value in row] for row in rows]
    widths = [max(len(line[i]) for line in [list(headers), *cells]) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [values[0].ljust(widths[0])]
        parts += [value.rjust(width) for value, width in zip(values[1:], widths[1:], strict=True)]
        return "  " + "  ".join(parts).rstrip()

    return "\n".join([title, line(headers), *(line(row) for row in cells)])
