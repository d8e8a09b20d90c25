"""Draws docs/_static/halo-windows.svg, the halos page's picture of the windows.

A dim of 24 elements split into 4 parts of 6 over 4 devices, with lo = 1, hi = 2. Each row is
one device: its part (solid), the window it calls the kernel on (outlined), and where the
window's extra elements come from. Interior windows take lo elements from the part below and
hi from the part above; the first window starts at 0 and the last ends at n (shifted inward),
so the kernel's own boundary rule meets the array's true ends.

    python scripts/draw_halo_windows.py      # writes docs/_static/halo-windows.svg

Plain SVG text, no dependencies; rerun it after changing the drawing.
"""

from __future__ import annotations

import pathlib

OUT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "_static" / "halo-windows.svg"

N, PARTS, LO, HI = 24, 4, 1, 2
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"]   # one per device's part
INK, MUTED = "#222", "#666"
FONT = "font-family='system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif'"
CELL, LEFT, TOP, ROW_H = 30, 120, 70, 56


def text(x, y, s, size=14, color=INK, anchor="start"):
  return (f"<text x='{x}' y='{y}' font-size='{size}' fill='{color}' text-anchor='{anchor}' "
          f"{FONT}>{s}</text>")


def rect(x, y, w, h, fill, stroke="none", width=1.5, opacity=1.0):
  return (f"<rect x='{x}' y='{y}' width='{w}' height='{h}' fill='{fill}' stroke='{stroke}' "
          f"stroke-width='{width}' fill-opacity='{opacity}'/>")


def window(c: int) -> tuple[int, int]:
  """Part c's window [start, stop): lo below and hi above, shifted inward at the ends."""
  p = N // PARTS
  start, stop = c * p - LO, (c + 1) * p + HI
  shift = max(0, -start) - max(0, stop - N)
  return start + shift, stop + shift


def draw() -> str:
  p = N // PARTS
  width, height = LEFT + N * CELL + 40, TOP + PARTS * ROW_H + 60
  out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
         f"viewBox='0 0 {width} {height}'>", rect(0, 0, width, height, "white"),
         text(LEFT, 28, f"n = {N} in {PARTS} parts, lo = {LO}, hi = {HI}: windows outlined, "
                        "kept parts solid", 15)]
  for i in range(N + 1):
    if i % p == 0 or i == N:
      out.append(text(LEFT + i * CELL, TOP - 10, str(i), 12, MUTED, "middle"))
  for c in range(PARTS):
    y = TOP + c * ROW_H
    out.append(text(LEFT - 12, y + 24, f"device {c}", 14, INK, "end"))
    start, stop = window(c)
    for i in range(start, stop):
      owner = i // p
      kept = c * p <= i < (c + 1) * p
      out.append(rect(LEFT + i * CELL + 2, y + 6, CELL - 4, 26, COLORS[owner],
                      opacity=1.0 if kept else 0.35))
    out.append(rect(LEFT + start * CELL, y + 2, (stop - start) * CELL, 34, "none", INK, 2))
    note = ("starts at 0" if c == 0 else "ends at n" if c == PARTS - 1 else
            f"{LO} below, {HI} above")
    out.append(text(LEFT + stop * CELL + 6 if c < PARTS - 1 else LEFT + start * CELL - 6,
                    y + 24, note, 12, MUTED, "start" if c < PARTS - 1 else "end"))
  out.append(text(LEFT, TOP + PARTS * ROW_H + 24,
                  "pale: a neighbour's elements (a collective-permute); their results are "
                  "dropped", 13, MUTED))
  out.append("</svg>")
  return "\n".join(out) + "\n"


if __name__ == "__main__":
  OUT.write_text(draw())
  print(f"wrote {OUT}")
