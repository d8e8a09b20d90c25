"""Draws docs/_static/gather-vs-shard.svg, the landing page's picture of the problem.

Left: a foreign call under jax.jit with a batch-sharded input, as XLA compiles it without
batchpart: every device all-gathers the batch and runs the kernel on all of it. Right: the same
call through batchpart: each device runs the kernel on its own rows, no collective.

    python scripts/draw_gather_vs_shard.py      # writes docs/_static/gather-vs-shard.svg

Plain SVG text, no dependencies; rerun it after changing the drawing.
"""

from __future__ import annotations

import pathlib

OUT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "_static" / "gather-vs-shard.svg"

DEVICES = 4
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"]   # one per device's rows
INK, MUTED, ALERT, GOOD = "#222", "#666", "#c0392b", "#1e7b45"
FONT = "font-family='system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif'"

W, H = 960, 330
PANEL_W = 450
ROW_H, ROW_GAP, TOP = 42, 14, 92
BLOCK = 30


def text(x, y, s, size=14, color=INK, anchor="start", weight="normal"):
  return (f"<text x='{x}' y='{y}' font-size='{size}' fill='{color}' text-anchor='{anchor}' "
          f"font-weight='{weight}' {FONT}>{s}</text>")


def rect(x, y, w, h, fill, stroke="none", rx=3, dash=""):
  dashed = f" stroke-dasharray='{dash}'" if dash else ""
  return (f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='{rx}' fill='{fill}' "
          f"stroke='{stroke}' stroke-width='1.5'{dashed}/>")


def arrow(x0, y, x1, color=MUTED):
  return (f"<line x1='{x0}' y1='{y}' x2='{x1 - 7}' y2='{y}' stroke='{color}' stroke-width='2'/>"
          f"<polygon points='{x1},{y} {x1 - 9},{y - 5} {x1 - 9},{y + 5}' fill='{color}'/>")


def panel(x0: int, stock: bool) -> list[str]:
  out = []
  if stock:
    out.append(text(x0, 30, "jax.ffi.ffi_call: gather, then all of it everywhere", 17,
                    weight="bold"))
    out.append(text(x0, 52, "XLA cannot see inside the kernel, so it replicates the call",
                    13, MUTED))
  else:
    out.append(text(x0, 30, "batchpart: each device runs its own rows", 17, weight="bold"))
    out.append(text(x0, 52, "the call's batch dims declared, XLA partitions it like a native op",
                    13, MUTED))
  out.append(text(x0 + 52, TOP - 12, "its shard", 12, MUTED, "middle"))
  out.append(text(x0 + 286, TOP - 12, "what the kernel runs on", 12, MUTED, "middle"))
  for d in range(DEVICES):
    y = TOP + d * (ROW_H + ROW_GAP)
    mid = y + ROW_H / 2
    out.append(text(x0, mid + 5, f"device {d}", 13, INK))
    out.append(rect(x0 + 70 - BLOCK / 2 + 8, mid - BLOCK / 2, BLOCK, BLOCK, COLORS[d]))
    kx = x0 + 170
    if stock:
      out.append(arrow(x0 + 112, mid, kx - 6, ALERT))
      out.append(text((x0 + 112 + kx) / 2 - 3, mid - 7, "all-gather", 11, ALERT, "middle"))
      out.append(rect(kx, y, 232, ROW_H, "#fdf0ef", ALERT, rx=6))
      for i in range(DEVICES):
        out.append(rect(kx + 10 + i * (BLOCK + 4), mid - BLOCK / 2, BLOCK, BLOCK, COLORS[i]))
      out.append(text(kx + 224, mid + 5, "4× work", 13, ALERT, "end", "bold"))
    else:
      out.append(arrow(x0 + 112, mid, kx - 6, GOOD))
      out.append(rect(kx, y, 232, ROW_H, "#eef7f1", GOOD, rx=6))
      out.append(rect(kx + 10, mid - BLOCK / 2, BLOCK, BLOCK, COLORS[d]))
      for i in range(1, DEVICES):
        out.append(rect(kx + 10 + i * (BLOCK + 4), mid - BLOCK / 2, BLOCK, BLOCK, "none",
                        "#bbb", dash="3,3"))
      out.append(text(kx + 224, mid + 5, "1× work", 13, GOOD, "end", "bold"))
  y = TOP + DEVICES * (ROW_H + ROW_GAP) + 10
  if stock:
    out.append(text(x0, y, "every device computes every row: 4× the work, plus the gather",
                    13, ALERT))
  else:
    out.append(text(x0, y, "every row computed once, no collective; results stay sharded",
                    13, GOOD))
  return out


def main() -> None:
  parts = [f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {W} {H}' width='{W}' "
           f"height='{H}' role='img' aria-label='A foreign call on a batch-sharded input: "
           f"stock jax gathers the batch onto every device; batchpart runs each device on "
           f"its own rows'>",
           rect(0, 0, W, H, "white", rx=0)]
  parts += panel(14, stock=True)
  parts.append(f"<line x1='{PANEL_W + 22}' y1='16' x2='{PANEL_W + 22}' y2='{H - 16}' "
               f"stroke='#ddd' stroke-width='1.5'/>")
  parts += panel(PANEL_W + 44, stock=False)
  parts.append("</svg>")
  OUT.parent.mkdir(parents=True, exist_ok=True)
  OUT.write_text("\n".join(parts) + "\n")
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
