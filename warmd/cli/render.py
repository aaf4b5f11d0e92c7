"""Console output that follows the terminal, and tables whose identifiers stay whole.

The width is $COLUMNS when set, else the width of the terminal on stdout, stderr or stdin,
else FALLBACK_WIDTH (a pipe or a log with no terminal anywhere). A table shows identifier
cells (task keys, kernel, module and entry names, fingerprints, node names) whole, on one
line, and prose cells wrapped at spaces, never a word cut. When it cannot at this width,
even without the columns that may be left out, it is stacked: each row becomes a block, its
first cell on a line of its own and every other cell under it as `header  value` (an
identifier longer than the whole line wraps after one of its separators, `/ _ . -`, every
character kept). --json has the same values. The node table of `warmd status`
(table_lines) keeps one line per node: its node names are shortened in the middle instead.
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from warmd import settings

FALLBACK_WIDTH = 120
ELLIPSIS = "…"
MIN_ID_WIDTH = 16  # an identifier column keeps at least this much: a head, "…", a digest
MIN_TEXT_WIDTH = 12
NO_WRAP = 1 << 16  # the prose width of output that goes to no terminal
STACK_INDENT = "   "  # a stacked row's cells, under its first cell
_SEPARATORS = "/_.-,: "  # where an identifier longer than a line may wrap (after one)


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


def prose_width() -> int:
    """The width prose (reports, reasons, notes) wraps at: $COLUMNS, else the terminal's on
    stdout or stderr; a pipe or a log with neither gets its lines whole (NO_WRAP)."""
    columns = settings.columns()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (1, 2):
        try:
            return os.get_terminal_size(fd).columns
        except OSError:
            continue
    return NO_WRAP


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


def fold(value: str, width: int, indent: str = "  ") -> list[str]:
    """value in lines of at most width, each but the last ending after a separator
    (`/ _ . - , :` or a space; a space at a break is dropped), the next ones indented:
    never cut. A run of more than a line without one breaks at the width."""
    lines, room = [], max(width, 2)
    while cell_len(value) > room:
        at = max(value.rfind(sep, 0, room) for sep in _SEPARATORS)
        cut = at + 1 if at > 0 else room
        lines.append(value[:cut].rstrip(" "))
        value = value[cut:].lstrip(" ")
        room = max(width - len(indent), 2)
    lines.append(value)
    return [lines[0], *(indent + line for line in lines[1:])]


@dataclass(frozen=True)
class Col:
    """One table column. kind: "id" (one line, whole), "text" (wraps at spaces, gets the
    width left over) or "fixed" (short values, shown whole). A column that may be `dropped`
    is left out, rightmost first, when the table cannot show every identifier whole
    otherwise (--json has every value)."""

    header: str
    kind: str = "fixed"
    justify: str = "left"
    dropped: bool = False


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
    need = [MIN_TEXT_WIDTH if c.kind == "text" else _natural(c, cells[i])
            for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    droppable = [i for i, c in enumerate(columns) if c.dropped]
    while droppable and sum(need[i] for i in shown) + _overhead(len(shown), boxed) > width:
        shown.remove(droppable.pop())
    return shown


def fits_whole(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]], width: int,
               boxed: bool = True) -> bool:
    """Whether the table fits `width` with every identifier whole on its line and every
    prose word whole (column_widths)."""
    cells = [[row[i] for row in rows] for i in range(len(columns))]
    widths = column_widths(columns, rows, width, boxed)
    if sum(widths) + _overhead(len(columns), boxed) > width:
        return False
    for i, col in enumerate(columns):
        need = (_natural(col, cells[i]) if col.kind != "text" else
                min(_natural(col, cells[i]), _longest_word(col, cells[i])))
        if widths[i] < need:
            return False
    return True


def fitted_table(title: str | None, columns: Sequence[Col],
                 rows: Sequence[Sequence[str | Text]], width: int | None = None,
                 boxed: bool = True, stack: bool = True) -> RenderableType:
    """The rows for `width` (default: console_width()): a rich Table whose identifiers and
    words stay whole, without the columns that may be dropped if that is what it takes;
    stacked rows (stacked) when even that does not fit. stack=False: a table whatever the
    width, an identifier too long for its column shortened in the middle. Plain str cells
    are not read as markup. boxed=False: no borders, two spaces between columns (a table
    inside a text report)."""
    width = width or console_width()
    keep = shown_columns(columns, rows, width, boxed)
    columns = [columns[i] for i in keep]
    rows = [[c if isinstance(c, Text) else Text(c) for c in (row[i] for i in keep)]
            for row in rows]
    if stack and not fits_whole(columns, rows, width, boxed):
        return stacked(title, columns, rows, width)
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


def stacked(title: str | None, columns: Sequence[Col], rows: Sequence[Sequence[str | Text]],
            width: int) -> Group:
    """The narrow layout of a table: per row, its first cell on a line of its own (bold),
    then each other cell that says something (not empty, not "-") as `header  value`,
    values wrapped (prose at spaces, identifiers after a separator) within `width`."""
    said = [i for i in range(1, len(columns)) if any(_says(row[i]) for row in rows)]
    pad = max((cell_len(columns[i].header) for i in said), default=0)
    lead = STACK_INDENT + " " * (pad + 2)
    out: list[Text] = [Text(title, style="bold")] if title else []
    for row in rows:
        out += [Text(line, style="bold") for line in fold(_plain(row[0]), width)]
        for col, cell in zip(columns[1:], row[1:], strict=True):
            if not _says(cell):
                continue
            lines = _value_lines(cell, col, width - len(lead))
            first = f"{STACK_INDENT}{col.header:<{pad}}  "
            style = cell.style if isinstance(cell, Text) else ""
            out += [Text(first if n == 0 else lead) + Text(line, style=style)
                    for n, line in enumerate(lines)]
    return Group(*out)


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _says(cell: str | Text) -> bool:
    """Whether a cell says something (not empty, not "-")."""
    return _plain(cell).strip() not in ("", "-")


def _value_lines(cell: str | Text, col: Col, width: int) -> list[str]:
    """A cell's lines in a stacked row, within width."""
    lines = _lines(cell)
    out = []
    for line in lines:
        if col.kind == "text":
            out += textwrap.wrap(line, width, break_long_words=False,
                                 break_on_hyphens=False, subsequent_indent="  ") or [""]
        else:
            lead = line[:len(line) - len(line.lstrip(" "))]
            out += [lead + part for part in fold(line.lstrip(" "), width - len(lead))]
    return out


def table_lines(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]],
                width: int | None = None) -> list[str]:
    """A borderless fitted_table as plain text lines (for reports built as text)."""
    width = width or console_width()
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, soft_wrap=False,
                      highlight=False)
    console.print(fitted_table(None, columns, rows, width, boxed=False, stack=False))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def wrapped(text: str, width: int | None = None, indent: str = "") -> list[str]:
    """Prose in lines of at most width (default: prose_width()), wrapped at spaces and
    never cut: continuation lines indented two more than the first; a word longer than a
    line (a path, a task key) wraps after one of its separators (fold)."""
    width = width or prose_width()
    lines = textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_long_words=False, break_on_hyphens=False) or [indent]
    out = []
    for line in lines:
        if cell_len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip(" "))]
        out += [lead + part for part in fold(line[len(lead):], width - len(lead))]
    return out
