"""Benchmark pages in docs/: the prose is written by hand, the measured tables by the scripts.

A script records its measurements in a JSON file beside the page (which the page's plot script
draws from) and rewrites only the lines between its markers in the page:

    <!-- NAME: begin (written by benchmarks/SCRIPT.py) -->

    ...

    <!-- NAME: end -->
"""

from __future__ import annotations

import importlib
import json


def replace_between(text: str, name: str, body: list[str]) -> str:
  """``text`` with the lines between NAME's begin and end markers replaced by ``body``
  (a blank line either side, so the markers stay blocks of their own)."""
  lines = text.split("\n")
  begins = [i for i, line in enumerate(lines) if line.startswith(f"<!-- {name}: begin")]
  ends = [i for i, line in enumerate(lines) if line.strip() == f"<!-- {name}: end -->"]
  if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
    raise ValueError(f"expected one '<!-- {name}: begin ... -->' line and one "
                     f"'<!-- {name}: end -->' line after it")
  return "\n".join(lines[:begins[0] + 1] + ["", *body, ""] + lines[ends[0]:])


def update_page(path: str, blocks: dict[str, list[str]]) -> None:
  """Replaces each named block of the page ``path``; writes nothing if a marker is missing."""
  with open(path) as f:
    text = f.read()
  for name, body in blocks.items():
    text = replace_between(text, name, body)
  with open(path, "w") as f:
    f.write(text)
  print(f"updated {path}: {', '.join(blocks)}")


def write_json(path: str, data) -> None:
  with open(path, "w") as f:
    json.dump(data, f, indent=1)
    f.write("\n")
  print(f"wrote {path}")


def draw(module: str) -> None:
  """Draws a page's chart with ``benchmarks/<module>.py``'s ``draw()`` (from the JSON just
  written); without matplotlib, says so and draws nothing."""
  try:
    plot = importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name != "matplotlib":
      raise
    print(f"matplotlib missing: no chart (pip install -e '.[bench]', then "
          f"python benchmarks/{module}.py)")
    return
  plot.draw()
