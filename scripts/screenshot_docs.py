"""Screenshots of the built docs site in headless Chromium, and a layout check.

    .venv/bin/python -m sphinx -W -b html docs docs/_build/html     # build the site first
    python scripts/screenshot_docs.py                               # -> docs/_build/screenshots/

For each page (the main ones by default, or those named with --pages) this writes
<page>.png, the top --height pixels of the page in a --width wide window (1280 x 2400 by
default), and prints one line of what a reader would trip over at that width: code cells,
outputs or tables wider than their box (a horizontal scrollbar; such boxes are outlined red in
the screenshot), a page wider than the window, and whether the page has copy buttons on its
code and an "on this page" contents on the right. It exits 1 if any page overflows.

Needs Chromium (Debian: `apt-get install chromium`; or set CHROMIUM to the binary). The pages
are checked in a temporary copy of the site, with a small script added to each that measures the
layout after the page has loaded; the built site itself is not changed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["index", "quickstart", "api", "reference", "callbacks", "reductions", "adopting",
         "explain", "partitioning", "benchmarks", "benchmarks-scaling", "benchmarks-adopt"]

# Runs after load: outlines every box whose content is wider than the box and writes the
# findings into the DOM, where --dump-dom shows them.
PROBE = """
<script>
window.addEventListener("load", () => {
  const boxes = document.querySelectorAll(
      ".bd-article pre, .bd-article div.highlight, .bd-article table, "
      + ".bd-article .pst-scrollable-table-container, .bd-article .cell_output");
  const wide = [];
  for (const el of boxes) {
    if (el.scrollWidth > el.clientWidth + 1) {
      el.style.outline = "3px solid red";
      wide.push(el.tagName.toLowerCase() + ": "
                + el.textContent.trim().replace(/\\s+/g, " ").slice(0, 70));
    }
  }
  const toc = document.querySelector(".bd-sidebar-secondary");
  const report = {
    overflowing: wide,
    page_wider_than_window: document.documentElement.scrollWidth > window.innerWidth,
    copy_buttons: document.querySelectorAll("button.copybtn").length,
    code_blocks: document.querySelectorAll(".bd-article div.highlight pre").length,
    contents_on_the_right: !!toc && toc.offsetWidth > 0
        && toc.querySelectorAll("nav a").length > 0,
  };
  const out = document.createElement("script");
  out.type = "application/json";
  out.id = "layout-report";
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
</script>
"""


def chromium() -> str:
  for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
    if name and shutil.which(name):
      return shutil.which(name)  # type: ignore[return-value]
  sys.exit("no Chromium found: apt-get install chromium, or set CHROMIUM")


def run(browser: str, args: list[str]) -> str:
  cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars=false",
         "--virtual-time-budget=5000", *args]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  return proc.stdout


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--html", type=pathlib.Path, default=REPO / "docs/_build/html")
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs/_build/screenshots")
  parser.add_argument("--width", type=int, default=1280)
  parser.add_argument("--height", type=int, default=2400)
  parser.add_argument("--pages", nargs="*", default=PAGES)
  args = parser.parse_args()
  if not (args.html / "index.html").exists():
    sys.exit(f"{args.html}/index.html not found: build the docs first")
  browser = chromium()
  args.out.mkdir(parents=True, exist_ok=True)
  failed = False
  with tempfile.TemporaryDirectory() as tmp:
    site = pathlib.Path(tmp) / "html"
    shutil.copytree(args.html, site)
    for page in args.pages:
      html = site / f"{page}.html"
      html.write_text(html.read_text().replace("</body>", PROBE + "</body>", 1))
      url = html.as_uri()
      window = f"--window-size={args.width},{args.height}"
      dom = run(browser, [window, "--dump-dom", url])
      found = re.search(r'<script type="application/json" id="layout-report">(.*?)</script>',
                        dom, re.S)
      report = json.loads(found.group(1)) if found else None
      png = args.out / f"{page}.png"
      run(browser, [window, f"--screenshot={png}", url])
      if report is None:
        print(f"{page}: no layout report (the page did not load?)")
        failed = True
        continue
      bad = report["overflowing"] or report["page_wider_than_window"]
      failed |= bool(bad)
      print(f"{page}: {'OVERFLOW' if bad else 'ok'}; {report['code_blocks']} code blocks, "
            f"{report['copy_buttons']} copy buttons, contents on the right: "
            f"{'yes' if report['contents_on_the_right'] else 'no'}; {png}")
      for box in report["overflowing"]:
        print(f"    wider than its box: {box}")
      if report["page_wider_than_window"]:
        print("    the page is wider than the window")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
