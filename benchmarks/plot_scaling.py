"""Draws docs/benchmarks-scaling-times.png from the recorded scaling run.

Reads docs/benchmarks-scaling.json (written by benchmarks/scaling.py, which calls ``draw`` after
each run; nothing is measured here) and plots each candidate's time per call against the number
of simulated devices, on a log scale, with the 8-device times as bars beside it: batchpart next
to stock `jax.ffi.ffi_call` and the hand-written `shard_map`, so the chart shows the gap to stock
rather than a "speed-up" over one device (which 8 devices on 2 physical cores cannot give any of
them).
Run: python benchmarks/plot_scaling.py (benchmarks/_plots.py says what it needs).
"""

from __future__ import annotations

import pathlib

from _plots import page_files, plt, recorded

DATA, OUT = page_files("scaling")

# The recorded candidates, drawn in this order: (the name the docs use, the line's style).
CANDIDATES = {
    "plain ffi_call": ("jax.ffi.ffi_call (stock)", dict(color="#c0392b", lw=2.2, marker="o")),
    "batchpart": ("batchpart", dict(color="#1f6fb4", lw=2.6, marker="o")),
    "shard_map wrapper":
        ("shard_map by hand", dict(color="#2e8b57", lw=1.6, marker="s", ls="--")),
    "custom_partitioning":
        ("custom_partitioning", dict(color="#8e6bb8", lw=1.2, marker="^", ls=":")),
    "built-in":
        ("XLA's built-in batch partitioner", dict(color="#999999", lw=1.2, marker="v", ls=":")),
}


def fmt(seconds: float) -> str:
  return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def draw(data: pathlib.Path = DATA, out: pathlib.Path = OUT) -> None:
  """Draws the chart at ``out`` from the run recorded in ``data``."""
  run_data = recorded(data)
  run = run_data["scaling"]
  setup = run_data.get("setup", {})   # runs recorded without it were all 16384 x 512
  rows, cols = setup.get("rows", 16384), setup.get("cols", 512)
  devices, times = run["devices"], run["times"]
  fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.0), width_ratios=[1.25, 1],
                                    layout="constrained")

  for key, (label, style) in CANDIDATES.items():
    left.plot(devices, [t * 1e3 for t in times[key]], label=label, **style)
  left.set_yscale("log")
  ticks = [50, 100, 200, 500, 1000]
  left.set_yticks(ticks, [str(t) for t in ticks])
  left.minorticks_off()
  left.set_ylim(50, 1500)
  left.set_xscale("log", base=2)
  left.set_xticks(devices, [str(d) for d in devices])
  left.set_xlabel("simulated CPU devices (one 2-core machine)")
  left.set_ylabel("time per call (ms, log scale)")
  left.set_title("Same total work, batch-sharded over the devices", fontsize=11)
  left.grid(True, which="both", alpha=0.25)
  left.legend(fontsize=8.5, loc="upper left")

  eight = devices.index(8)
  values = [times[k][eight] for k in CANDIDATES]
  bars = right.barh([label for label, _ in CANDIDATES.values()], [v * 1e3 for v in values],
                    color=[style["color"] for _, style in CANDIDATES.values()])
  for bar, v in zip(bars, values):
    right.text(bar.get_width() + 15, bar.get_y() + bar.get_height() / 2, fmt(v),
               va="center", fontsize=9)
  right.invert_yaxis()
  right.set_xlim(0, max(values) * 1e3 * 1.25)
  right.set_xlabel("time per call on 8 devices (ms)")
  right.set_title("8 devices: stock gathers, the others do not", fontsize=11)
  right.grid(True, axis="x", alpha=0.25)
  right.tick_params(axis="y", labelsize=9)

  fig.suptitle(f"Row-wise softmax FFI call, {rows} x {cols} float32 (benchmarks/scaling.py)",
               fontsize=12)
  fig.savefig(out, dpi=110)
  print(f"wrote {out}")


if __name__ == "__main__":
  draw()
