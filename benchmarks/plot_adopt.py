"""Draws docs/benchmarks-adopt-times.png from the table in docs/benchmarks-adopt.md.

Reads the recorded times (written by benchmarks/adopt.py; nothing is measured here) and draws,
for each op, stock's time next to batchpart's on a log scale, labelled with both times and
their ratio.

    .venv/bin/pip install matplotlib      # or pip install -e ".[bench]"
    .venv/bin/python benchmarks/plot_adopt.py
"""

from __future__ import annotations

import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
TABLE = DOCS / "benchmarks-adopt.md"
OUT = DOCS / "benchmarks-adopt-times.png"

# Short labels for the table's op column, in its order.
SHORT = [
    ("jax-finufft nufft1", "jax-finufft nufft1\n(partition_primitive)"),
    ("jax-finufft nufft2", "jax-finufft nufft2\n(partition_primitive)"),
    ("package calling jax.ffi.ffi_call", "a package's own ffi_call\n(partition_ffi_target)"),
    ("batch dims in the middle", "batch dims in the middle\n(partition_ffi_target)"),
    ("jnp.linalg.cholesky", "jnp.linalg.cholesky\n(partition_primitive)"),
    ("jnp.linalg.eigh", "jnp.linalg.eigh\n(partition_primitive)"),
    ("jnp.linalg.qr", "jnp.linalg.qr\n(partition_primitive)"),
    ("jnp.linalg.svd", "jnp.linalg.svd\n(partition_primitive)"),
]


def ms(cell: str) -> float:
  value, unit = re.fullmatch(r"\s*([\d.]+)\s*(ms|s)\s*", cell).groups()
  return float(value) * (1e3 if unit == "s" else 1.0)


def rows() -> list[tuple[str, float, float]]:
  """(label, stock ms, batchpart ms) of each row of the table, in order."""
  out = []
  for line in TABLE.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 7 or not cells[3].endswith("ms"):
      continue
    label = next(short for start, short in SHORT if cells[0].startswith(start))
    out.append((label, ms(cells[3]), ms(cells[5])))
  return out


def main() -> None:
  data = rows()
  fig, ax = plt.subplots(figsize=(9.5, 5.2), layout="constrained")
  y = range(len(data))
  h = 0.38
  ax.barh([i - h / 2 for i in y], [d[1] for d in data], h, color="#c0392b",
          label="stock (gathered onto every device)")
  ax.barh([i + h / 2 for i in y], [d[2] for d in data], h, color="#1f6fb4",
          label="declared with batchpart")
  for i, (_, stock, ours) in enumerate(data):
    ax.text(stock * 1.08, i - h / 2, f"{stock:.0f} ms", va="center", fontsize=8.5)
    ax.text(ours * 1.08, i + h / 2, f"{ours:.1f} ms  ({stock / ours:.1f}x faster)",
            va="center", fontsize=8.5)
  ax.set_yticks(list(y), [d[0] for d in data], fontsize=9)
  ax.invert_yaxis()
  ax.set_xscale("log")
  ax.set_xlim(2, 8000)
  ticks = [3, 10, 30, 100, 300, 1000, 3000]
  ax.set_xticks(ticks, [str(t) for t in ticks])
  ax.minorticks_off()
  ax.set_xlabel("time per call on 8 simulated CPU devices (ms, log scale)")
  ax.set_title("Existing packages, unchanged: stock vs declared (benchmarks/adopt.py)",
               fontsize=11)
  ax.grid(True, axis="x", which="major", alpha=0.25)
  fig.legend(fontsize=9, loc="outside lower center", ncols=2)
  fig.savefig(OUT, dpi=110)
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
