"""Break points in long inline code: ``mark_batch_partitionable()`` may wrap after an ``_``,
never inside a word.

Sphinx renders inline code as one ``<span class="pre">`` per word, which the theme does not let
wrap: a long name then either runs out of its table cell or sidebar, or (with CSS that lets it
wrap anywhere) breaks as ``batch_partit`` / ``ionable``. After the build, each long word is cut
into pieces after ``_ . / , ( : ;`` and between the words of a CamelCase name, one
``span.pre`` per piece with a ``<wbr>`` between them, in every page, the sidebars' contents
included (the theme renders those from templates after the doctrees are written, so no doctree
transform reaches them). Each piece keeps the theme's no-wrap, so a line breaks between pieces
and nowhere else (not after the hyphen of ``all-reduce``); docs/_static/custom.css lets the
code wrap between its words and pieces.
"""

from __future__ import annotations

import pathlib
import re

#: a word of inline code with no break point yet
WORD = re.compile(r'(<span class="pre">)([^<]{12,})(</span>)')
#: where a break reads naturally: after these, or between the words of a CamelCase name
#: (``NotImplemented|Error``); never elsewhere between two letters
AFTER = re.compile(r"(?<=[_./,(:;])(?=[^_./,():;])|(?<=[a-z])(?=[A-Z][a-z])")


def with_breaks(html: str) -> str:
  """``html`` with every long word of inline code cut into pieces at its break points."""
  return WORD.sub(lambda m: m[1] + AFTER.sub(f"{m[3]}<wbr>{m[1]}", m[2]) + m[3], html)


def on_build_finished(app, exception):
  if exception is not None or app.builder.format != "html":
    return
  for page in pathlib.Path(app.outdir).rglob("*.html"):
    html = page.read_text(encoding="utf-8")
    new = with_breaks(html)
    if new != html:
      page.write_text(new, encoding="utf-8")


def setup(app):
  app.connect("build-finished", on_build_finished)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
