"""Console output that follows the terminal, and tables whose identifiers stay whole.

The width is $COLUMNS when set, else the width of the terminal on stdout, stderr or stdin,
else FALLBACK_WIDTH (a pipe or a log with no terminal anywhere). In a table, identifier
cells (task keys, kernel, module and entry names, fingerprints, node names) are never
wrapped or broken mid-word: a value longer than its column is shortened in the middle with
an ellipsis, keeping its head and its tail (a task key's unique digest, which
--task-filter accepts as it is); --json always has every identifier whole. Prose cells wrap
at spaces and take what is left; a word too long for them ends in an ellipsis, never folds.
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from warmd import settings

FALLBACK_WIDTH = 120
ELLIPSIS = "…"
MIN_ID_WIDTH = 16  # an identifier column keeps at least this much: a head, "…", a digest
MIN_TEXT_WIDTH = 12


def console_width() -> int:
    """The width to render for: $COLUMNS, else the terminal's, else FALLBACK_WIDTH."""
    columns = settings.columns()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (1, 2, 0):
        try:
            return os.get_terminal_size(fd).columns
        except OSError:
            continue
    return FALLBACK_WIDTH


def make_console(stderr: bool = False) -> Console:
    """A console at console_width(), for stdout or stderr; lines are never soft-wrapped."""
    return Console(stderr=stderr, width=console_width(), soft_wrap=False)


def shorten(value: str, width: int) -> str:
    """value, or its head + "…" + its tail when longer than width; the tail keeps the last
    path segment (a task key's digest) whole when that fits in half the width."""
    if cell_len(value) <= width:
        return value
    if width <= 1:
        return ELLIPSIS[:width]
    last = value.rsplit("/", 1)[-1]
    tail_len = len(last) + 1 if len(last) + 1 <= width // 2 else (width - 1) // 2
    head_len = width - 1 - tail_len
    return value[:head_len] + ELLIPSIS + value[len(value) - tail_len:]


@dataclass(frozen=True)
class Col:
    """One table column. kind: "id" (never wrapped, shortened in the middle), "text"
    (wraps at spaces, gets the width left over) or "fixed" (short values, shown whole).
    A column that may be `dropped` is left out, rightmost first, when the table cannot show
    every identifier whole otherwise (--json has every value); an identifier that need not
    stay `whole` for that (a digest: its head and tail say enough) is shortened instead."""

    header: str
    kind: str = "fixed"
    justify: str = "left"
    dropped: bool = False
    whole: bool = True


def _overhead(count: int, boxed: bool) -> int:
    """Characters a table of `count` columns spends outside its cells: borders and padding
    (boxed), or one leading space and two between columns (plain)."""
    return 3 * count + 1 if boxed else 2 * count


def _lines(cell: str | Text) -> list[str]:
    return (cell.plain if isinstance(cell, Text) else cell).splitlines() or [""]


def _natural(col: Col, cells: list[str | Text]) -> int:
    return max([cell_len(col.header)] + [cell_len(line) for c in cells for line in _lines(c)])


def _longest_word(col: Col, cells: list[str | Text]) -> int:
    words = [w for c in cells for line in _lines(c) for w in line.split()]
    return max([cell_len(col.header)] + [cell_len(w) for w in words])


def column_widths(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]],
                  width: int, boxed: bool = True) -> list[int]:
    """Each column's width so that the table fits `width` (borders and padding included).
    Every column starts at its minimum (fixed: its natural width; identifier and text: a
    small floor); the room left then goes first to identifier columns, up to their natural
    width, then to text columns, up to their longest word, then up to their natural width."""
    cells = [[row[i] for row in rows] for i in range(len(columns))]
    natural = [_natural(c, cells[i]) for i, c in enumerate(columns)]
    floor = {"id": MIN_ID_WIDTH, "text": MIN_TEXT_WIDTH}
    widths = [natural[i] if c.kind == "fixed" else min(natural[i], floor[c.kind])
              for i, c in enumerate(columns)]
    left = width - _overhead(len(columns), boxed) - sum(widths)
    if left < 0:  # a very narrow terminal: every shrinkable column gives up its share
        left = _shrink(widths, [i for i, c in enumerate(columns) if c.kind != "fixed"], -left)
    text = [i for i, c in enumerate(columns) if c.kind == "text"]
    words = {i: min(natural[i], _longest_word(columns[i], cells[i])) for i in text}
    for goal in ({i: natural[i] for i, c in enumerate(columns) if c.kind == "id"}, words,
                 {i: natural[i] for i in text}):
        left = _fill(widths, goal, left)
    return widths


def _shrink(widths: list[int], shrinkable: list[int], excess: int) -> int:
    """Take `excess` from the shrinkable columns, keeping each at 4 or more; returns the
    room left (negative when even that does not fit: the console then crops)."""
    while excess > 0 and shrinkable:
        widest = max(shrinkable, key=lambda i: widths[i])
        if widths[widest] <= 4:
            break
        widths[widest] -= 1
        excess -= 1
    return -excess


def _fill(widths: list[int], goal: dict[int, int], left: int) -> int:
    """Raise widths[i] towards goal[i] in equal shares of `left`; returns what is left."""
    for n, i in enumerate(sorted(goal, key=lambda i: goal[i] - widths[i])):
        if left <= 0:
            break
        grow = min(goal[i] - widths[i], left // (len(goal) - n))
        if grow > 0:
            widths[i] += grow
            left -= grow
    return left


def _cell(cell: str | Text, col: Col, width: int) -> str | Text:
    if col.kind != "id":
        return cell
    if isinstance(cell, Text):
        return Text("\n".join(shorten(line, width) for line in _lines(cell)), style=cell.style)
    return Text("\n".join(shorten(line, width) for line in _lines(cell)))


def shown_columns(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]], width: int,
                  boxed: bool = True) -> list[int]:
    """The indices of the columns to show: all, or without the rightmost droppable ones
    while the others' values (text columns at their floor) do not fit whole."""
    cells = [[row[i] for row in rows] for i in range(len(columns))]
    need = [MIN_TEXT_WIDTH if c.kind == "text" else
            min(_natural(c, cells[i]), MIN_ID_WIDTH) if not c.whole else _natural(c, cells[i])
            for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    droppable = [i for i, c in enumerate(columns) if c.dropped]
    while droppable and sum(need[i] for i in shown) + _overhead(len(shown), boxed) > width:
        shown.remove(droppable.pop())
    return shown


def fitted_table(title: str | None, columns: Sequence[Col],
                 rows: Sequence[Sequence[str | Text]], width: int | None = None,
                 boxed: bool = True) -> Table:
    """A rich Table for `width` (default: console_width()) whose identifiers stay whole or
    are shortened in the middle, never broken (columns that may be dropped go first).
    Plain str cells are not read as markup. boxed=False: no borders, two spaces between
    columns (a table inside a text report)."""
    width = width or console_width()
    keep = shown_columns(columns, rows, width, boxed)
    columns = [columns[i] for i in keep]
    rows = [[c if isinstance(c, Text) else Text(c) for c in (row[i] for i in keep)]
            for row in rows]
    widths = column_widths(columns, rows, width, boxed)
    table = (Table(title=title) if boxed else
             Table(title=title, box=None, padding=(0, 1), show_edge=False))
    for col, w in zip(columns, widths, strict=True):
        table.add_column(col.header, justify=col.justify, no_wrap=col.kind != "text",
                         overflow="ellipsis", width=w if col.kind != "text" else None,
                         min_width=w if col.kind == "text" else None,
                         max_width=w if col.kind == "text" else None)
    for row in rows:
        table.add_row(*(_cell(c, col, w) for c, col, w in zip(row, columns, widths, strict=True)))
    return table


def table_lines(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]],
                width: int | None = None) -> list[str]:
    """A borderless fitted_table as plain text lines (for reports built as text)."""
    width = width or console_width()
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, soft_wrap=False,
                      highlight=False)
    console.print(fitted_table(None, columns, rows, width, boxed=False))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def wrapped(text: str, width: int | None = None, indent: str = "") -> list[str]:
    """Prose in lines of at most width (default: console_width()), wrapped at spaces and
    never cut: continuation lines indented two more than the first."""
    width = width or console_width()
    return textwrap.wrap(text, width, initial_indent=indent,
                         subsequent_indent=indent + "  ") or [indent]
