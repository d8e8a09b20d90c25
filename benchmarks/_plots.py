"""What the chart scripts (benchmarks/plot_*.py) share: matplotlib drawing to files only (no
display on the benchmark machines), where a page's recorded JSON and its chart lie in docs/, and
reading the JSON. Each script draws its page's chart when run:

    .venv/bin/pip install matplotlib      # or pip install -e ".[bench]"
    .venv/bin/python benchmarks/plot_PAGE.py
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def page_files(page: str) -> tuple[pathlib.Path, pathlib.Path]:
  """(docs/benchmarks-PAGE.json, docs/benchmarks-PAGE-times.png): a page's recorded run and the
  chart drawn from it."""
  return DOCS / f"benchmarks-{page}.json", DOCS / f"benchmarks-{page}-times.png"


def recorded(data: pathlib.Path) -> dict[str, Any]:
  """The run recorded in ``data``."""
  return json.loads(pathlib.Path(data).read_text())


__all__ = ["DOCS", "page_files", "plt", "recorded"]
