"""The views laid out for the terminal they are printed on: the concise default of every read-only
command on a terminal (``--full`` prints every table whole; a pipe gets plain text with nothing cut).

An operator reads these in an 80x24 pane during an incident, so this module owns fitting the
``Section``s of render.py into ``width`` x ``height``, by three rules:

1. Nothing wider than the terminal, and nothing wrapped. IDs are cut from the middle (``middle``:
   the host prefix and the pid:nonce tail, which tell two workers on one host apart, both stay),
   free text from its end; a column marked ``below`` (a reason) goes on an indented line of its own
   under its row. Columns marked ``whole`` (an ID to copy into the next command) are never cut.
2. Nothing taller: every section keeps its title and header, the rows are shared out (the small
   sections whole first, the rest split evenly), and a section cut short ends with a line counting
   the rows left out and naming ``--full``.
3. Plain lines, no borders: a border costs four lines per table and the width of each column.

Pure functions of Sections and a size: no Redis, no terminal I/O (render.emit prints them).
"""

from __future__ import annotations

from typing import Sequence

ELLIPSIS = "…"
#: The narrowest an ID column is cut to, and a free-text column, before the line itself is cut (a
#: column no wider than the text floor, a count, a duration or a state, is never cut).
ID_FLOOR, TEXT_FLOOR = 12, 12
INDENT = "  "
GAP = "  "
MORE = "(--full shows all)"


def middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut from the middle.

    A worker ID is ``host:pid:nonce`` (or ``host:gpu0``): two workers on one host differ only after
    the first colon, so that tail is kept whole while it leaves the head a third of the width, and
    the head keeps the host's first characters (its short name). Other text keeps both halves."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    keep = width - 1
    colon = text.find(":")
    tail = len(text) - colon if colon > 0 else 0
    if not 0 < tail <= keep - keep // 3:
        tail = keep // 2
    return text[:keep - tail] + ELLIPSIS + text[len(text) - tail:]


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at its end (an ellipsis says so)."""
    if len(text) <= width:
        return text
    return text[:max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def column_widths(natural: Sequence[int], ids: Sequence[int], whole: Sequence[int], room: int) -> list[int]:
    """Each column's width so that they fit ``room`` characters: free-text columns shrink first (the
    widest first, down to TEXT_FLOOR), then ID columns (down to ID_FLOOR); ``whole`` ones never.
    Where even the floors do not fit, the widths stay at their floors (the line is cut last)."""
    widths = list(natural)
    excess = sum(widths) - room
    text = [i for i in range(len(widths)) if i not in ids and i not in whole]
    for tier, floor in ((text, TEXT_FLOOR), ([i for i in ids if i not in whole], ID_FLOOR)):
        while excess > 0:
            shrinkable = [i for i in tier if widths[i] > min(natural[i], floor)]
            if not shrinkable:
                break
            i = max(shrinkable, key=lambda j: widths[j])
            widths[i] -= 1
            excess -= 1
    return widths


def section_blocks(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int,
                   ids: Sequence[int] = (), whole: Sequence[int] = (),
                   below: Sequence[int] = ()) -> tuple[list[str], list[list[str]]]:
    """(the title and header lines, one block of lines per row) of one table at ``width``."""
    shown = [i for i in range(len(columns)) if i not in below]
    head = [clip(title, width)]
    if not rows:
        return head, []
    natural = [max([len(columns[i])] + [len(r[i]) for r in rows]) for i in shown]
    room = width - len(INDENT) - len(GAP) * max(0, len(shown) - 1)
    widths = column_widths(natural, [k for k, i in enumerate(shown) if i in ids],
                           [k for k, i in enumerate(shown) if i in whole], room)

    def line(cells: Sequence[str], cut_ids: bool) -> str:
        out = []
        for k, i in enumerate(shown):
            cell, w = cells[i], widths[k]
            cell = cell if i in whole else (middle(cell, w) if cut_ids and i in ids else clip(cell, w))
            out.append(cell.ljust(w))
        return clip((INDENT + GAP.join(out)).rstrip(), width)

    if any(columns[i] for i in shown):
        head.append(line(columns, False))
    blocks = []
    for r in rows:
        extra = " · ".join(f"{columns[i]}: {r[i]}" if columns[i] else r[i] for i in below if r[i])
        blocks.append([line(r, True)] + ([clip(INDENT * 2 + extra, width)] if extra else []))
    return head, blocks


def share(needs: Sequence[int], budget: int) -> list[int]:
    """Lines granted to each need out of ``budget``: the smallest needs whole first, then an even
    split of what is left (so one long table never pushes a short one off the screen)."""
    grants = [0] * len(needs)
    left = max(0, budget)
    order = sorted(range(len(needs)), key=lambda i: needs[i])
    for n, i in enumerate(order):
        grants[i] = min(needs[i], left // (len(order) - n))
        left -= grants[i]
    return grants


def fit_lines(tables: Sequence[tuple[list[str], list[list[str]]]], width: int, height: int) -> list[str]:
    """The tables (``section_blocks``) in at most ``height`` lines of at most ``width`` characters."""
    fixed = sum(len(head) for head, _ in tables)
    grants = share([sum(len(b) for b in blocks) for _, blocks in tables], height - fixed)
    out: list[str] = []
    for (head, blocks), grant in zip(tables, grants):
        out += head
        need = sum(len(b) for b in blocks)
        if need <= grant:
            out += [line for b in blocks for line in b]
            continue
        used, shown = 0, 0
        for b in blocks:  # whole blocks only: a row never loses its reason line
            if used + len(b) > grant - 1:
                break
            out += b
            used += len(b)
            shown += 1
        out.append(clip(f"{INDENT}... {len(blocks) - shown} more {MORE}", width))
    return [clip(line, width) for line in out[:max(1, height)]]
