"""Every page of the built docs site in headless Chromium at a laptop's width: screenshots and
a check of what a reader would trip over.

    .venv/bin/python -m sphinx -W -b html docs docs/_build/html     # build the site first
    .venv/bin/python scripts/screenshot_docs.py                     # -> docs/_build/screenshots/

For each page (every page of the site, or those named with --pages) this writes <page>.png,
the whole page in a --width wide window (1280 px by default), with every finding outlined red,
and prints the findings. It exits 1 if any page has one. What it looks for:

* code a reader copies (input cells, shell commands) wider than its box: a line that scrolls
  or is cut off;
* a table wider than the article, and a page wider than the window;
* a word of inline code broken across two lines (``@bp.batch_partit`` / ``ionable``), in the
  article or in either sidebar;
* an entry of the contents, on the left or on the right, cut off at the sidebar's edge;
* a heading heavier or larger than the heading above its level (``###`` bolder than ``##``);
* more than one search box;
* a ``bp.explain`` report wider than its box (outputs keep their lines and scroll sideways
  rather than wrap without their indentation; a report is read line by line, so it must fit);
* a Jupyter temp file's name (``at 3712901551.py:4``) in the text.

Needs Playwright (``pip install playwright``) and a Chromium: Playwright's own
(``playwright install chromium``), or the system's (Debian: ``apt-get install chromium``),
found on the PATH or named by the CHROMIUM variable.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# Runs in the page once it has loaded. Returns {finding kind: [short text of each offender]}
# and outlines each offender red for the screenshot.
PROBE = r"""
() => {
  const findings = {};
  const note = (kind, el, label) => {
    el.style.outline = "3px solid red";
    (findings[kind] ??= []).push(
        (label ?? el.textContent).trim().replace(/\s+/g, " ").slice(0, 80));
  };
  const wide = el => el.scrollWidth > el.clientWidth + 1;
  const article = document.querySelector(".bd-article");
  const outputs = ".cell_output, div.output";

  for (const pre of article.querySelectorAll("div.highlight pre"))
    if (!pre.closest(outputs) && wide(pre)) note("code wider than its box", pre);
  for (const box of article.querySelectorAll(".pst-scrollable-table-container, table"))
    if (wide(box)) note("table wider than the article", box);
  if (document.documentElement.scrollWidth > window.innerWidth + 1)
    (findings["page wider than the window"] ??= []).push(
        `${document.documentElement.scrollWidth} px`);

  // Inline code may wrap only at a <wbr> (or a space): each stretch of text between two break
  // points must lie on one line.
  for (const code of document.querySelectorAll(
      ".bd-article code, .bd-sidebar-primary code, .bd-sidebar-secondary code")) {
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let text = walker.nextNode(); text; text = walker.nextNode()) {
      for (const m of text.data.matchAll(/\S+/g)) {
        const range = document.createRange();
        range.setStart(text, m.index);
        range.setEnd(text, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (lines.size > 1) note("inline code broken inside a word", code);
      }
    }
  }
  for (const link of document.querySelectorAll(
      ".bd-sidebar-primary nav a, .bd-sidebar-secondary nav a")) {
    const bar = link.closest(".bd-sidebar-primary, .bd-sidebar-secondary");
    if (!link.offsetParent) continue;                 // a collapsed entry
    const right = Math.max(...[link, ...link.querySelectorAll("*")].map(
        el => el.getBoundingClientRect().right));
    const edge = Math.min(bar.getBoundingClientRect().right, window.innerWidth);
    if (right > edge + 1)
      note("contents entry cut off", link);
  }

  const style = level => {
    const h = article.querySelector(`h${level}`);
    if (!h) return null;
    const s = getComputedStyle(h);
    return {el: h, weight: Number(s.fontWeight), size: parseFloat(s.fontSize)};
  };
  for (let level = 2; level <= 4; level++) {
    const upper = style(level - 1), lower = style(level);
    if (upper && lower && (lower.weight > upper.weight || lower.size >= upper.size))
      note("heading outweighs the level above", lower.el,
           `h${level} ${lower.weight}/${lower.size}px over h${level - 1} `
           + `${upper.weight}/${upper.size}px`);
  }

  const search = [...document.querySelectorAll(
      "button.search-button-field, form.bd-search, input[type=search]")].filter(
      el => el.offsetParent && !el.closest("dialog"));
  if (search.length > 1)
    for (const box of search) note("more than one search box", box, "search");

  // Outputs keep their lines and scroll (compiled HLO is wide); a bp.explain report, which
  // is read line by line, must fit.
  for (const pre of article.querySelectorAll(".cell_output pre, div.output pre"))
    if (pre.textContent.startsWith("batchpart.explain") && wide(pre))
      note("bp.explain report wider than its box", pre);

  const temp = /\b(\d{6,}\.py:\d+|ipykernel_\d+)/;
  const m = article.innerText.match(temp);
  if (m) (findings["Jupyter temp file in the text"] ??= []).push(m[0]);
  return findings;
}
"""


def chromium() -> str | None:
  """The system's Chromium, or None for Playwright's own."""
  for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
    if name and shutil.which(name):
      return shutil.which(name)
  return None


def pages_of(html: pathlib.Path, names: list[str] | None) -> list[pathlib.Path]:
  """The site's pages: the named ones, or every page a reader can reach."""
  if names:
    return [html / f"{name}.html" for name in names]
  skip = {"genindex.html", "search.html", "py-modindex.html"}
  return sorted(p for p in html.glob("*.html") if p.name not in skip)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--html", type=pathlib.Path, default=REPO / "docs/_build/html")
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs/_build/screenshots")
  parser.add_argument("--width", type=int, default=1280)
  parser.add_argument("--height", type=int, default=800)
  parser.add_argument("--pages", nargs="*", help="page names (index, halos, ...); all if none")
  args = parser.parse_args()
  if not (args.html / "index.html").exists():
    sys.exit(f"{args.html}/index.html not found: build the docs first")
  from playwright.sync_api import sync_playwright

  args.out.mkdir(parents=True, exist_ok=True)
  failed = 0
  with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": args.width, "height": args.height})
    for html in pages_of(args.html, args.pages):
      page.goto(html.as_uri())
      page.wait_for_load_state("load")
      page.evaluate("document.fonts.ready")
      findings = page.evaluate(PROBE)
      png = args.out / f"{html.stem}.png"
      page.screenshot(path=png, full_page=True)
      failed += bool(findings)
      print(f"{html.stem}: {'ok' if not findings else 'FOUND'}  ({png})")
      for kind, items in findings.items():
        for item in items:
          print(f"    {kind}: {item}")
    browser.close()
  print(f"{failed} page(s) with findings at {args.width} px")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
