"""Draws docs/benchmarks-adopt-times.png from the recorded adoption run.

Reads docs/benchmarks-adopt.json (written by benchmarks/adopt.py, which calls ``draw`` after
each run; nothing is measured here) and draws, for each op, stock's time next to batchpart's on
a log scale, labelled with both times and their ratio.
Run: python benchmarks/plot_adopt.py (benchmarks/_plots.py says what it needs).
"""

from __future__ import annotations

import pathlib

from _plots import page_files, plt, recorded

DATA, OUT = page_files("adopt")

# Short labels for the recorded rows, by their key.
SHORT = {
    "nufft1": "jax-finufft nufft1\n(partition_primitive)",
    "nufft2": "jax-finufft nufft2\n(partition_primitive)",
    "ffi_target": "a package's own ffi_call\n(partition_ffi_target)",
    "anywhere": "batch dims in the middle\n(partition_ffi_target)",
    "cholesky": "jnp.linalg.cholesky\n(partition_primitive)",
    "eigh": "jnp.linalg.eigh\n(partition_primitive)",
    "qr": "jnp.linalg.qr\n(partition_primitive)",
    "svd": "jnp.linalg.svd\n(partition_primitive)",
}


def rows(data: pathlib.Path = DATA) -> list[tuple[str, float, float]]:
  """(label, stock ms, batchpart ms) of each recorded row, in order."""
  return [(SHORT[r["key"]], r["stock_s"] * 1e3, r["batchpart_s"] * 1e3)
          for r in recorded(data)["rows"]]


def draw(data: pathlib.Path = DATA, out: pathlib.Path = OUT) -> None:
  """Draws the chart at ``out`` from the rows recorded in ``data``."""
  ops = rows(data)
  fig, ax = plt.subplots(figsize=(9.5, 5.2), layout="constrained")
  y = range(len(ops))
  h = 0.38
  ax.barh([i - h / 2 for i in y], [d[1] for d in ops], h, color="#c0392b",
          label="stock (gathered onto every device)")
  ax.barh([i + h / 2 for i in y], [d[2] for d in ops], h, color="#1f6fb4",
          label="declared with batchpart")
  for i, (_, stock, ours) in enumerate(ops):
    ax.text(stock * 1.08, i - h / 2, f"{stock:.0f} ms", va="center", fontsize=8.5)
    ax.text(ours * 1.08, i + h / 2, f"{ours:.1f} ms  ({stock / ours:.1f}x faster)",
            va="center", fontsize=8.5)
  ax.set_yticks(list(y), [d[0] for d in ops], fontsize=9)
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
  fig.savefig(out, dpi=110)
  print(f"wrote {out}")


if __name__ == "__main__":
  draw()
