"""Every page's code runs as written: README.md and each docs/*.md, as a plain script.

For each page, the ```python fences and ``{code-cell} python`` cells are concatenated in page
order and run as one script by ``sys.executable`` in a fresh process, in an empty directory
holding only the files the page shows with ``{literalinclude}`` (the files it tells the reader
to save), with no ``XLA_FLAGS`` or ``JAX_*`` variables inherited: so a page that needs 8 CPU
devices must set them itself, as a reader on a laptop would. The script must exit 0 within
PAGE_TIMEOUT_S.

Blocks that are not code to run are listed in NOT_RUNNABLE, each with the reason; every other
```python block on every page runs. Slow (every page compiles and runs its examples on 8
simulated devices): marked ``slow``; deselect with ``-m "not slow"``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PAGE_TIMEOUT_S = 600

#: (page, the block's first line) -> why the block is not run. Keep this short.
NOT_RUNNABLE = {
    ("docs/callbacks.md", "bp.pure_callback(callback, result_shape_dtypes, *args,"):
        "the signatures of bp.pure_callback and bp.io_callback, listed, not called",
    ("docs/callbacks.md", "bp.buffer_callback(callback, result_shape_dtypes, *,"):
        "the signature of bp.buffer_callback, listed, not called",
}

FENCE = re.compile(r"^(?P<fence>`{3,})\s*(?P<info>.*)$")
PYTHON_INFO = re.compile(r"^(python|\{code-cell\}\s+(python3?|ipython3?))\s*$")
LITERALINCLUDE = re.compile(r"^(`{3,})\{literalinclude\}\s+(?P<path>\S+)\s*$")


def blocks(page: pathlib.Path) -> list[tuple[int, str, str]]:
  """(line number, info string, body) of every fenced block of the page, in order; a
  ``{code-cell}``'s options (``:tags: ...`` lines or a ``---`` front block) are dropped."""
  lines = page.read_text().splitlines()
  out, i = [], 0
  while i < len(lines):
    m = FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    fence, info, start = m["fence"], m["info"].strip(), i + 1
    j = start
    while j < len(lines) and not (lines[j].startswith(fence) and lines[j].strip() == fence):
      j += 1
    body = lines[start:j]
    if info.startswith("{"):
      if body and body[0].strip() == "---":
        end = body.index("---", 1) if "---" in body[1:] else 0
        body = body[end + 1:]
      while body and re.match(r"^:[\w-]+:", body[0]):
        body = body[1:]
    out.append((start, info, "\n".join(body)))
    i = j + 1
  return out


def python_blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  rel = page.relative_to(REPO).as_posix()
  runnable = []
  for line, info, body in blocks(page):
    if not PYTHON_INFO.match(info):
      continue
    first = body.strip().splitlines()[0] if body.strip() else ""
    if any(rel == p and first.startswith(start) for p, start in NOT_RUNNABLE):
      continue
    runnable.append((line, body))
  return runnable


def included_files(page: pathlib.Path) -> list[pathlib.Path]:
  return [page.parent / m["path"] for line in page.read_text().splitlines()
          if (m := LITERALINCLUDE.match(line))]


def script(page: pathlib.Path) -> str:
  parts = [f"# {page.relative_to(REPO)}, line {line}\n{body}\n"
           for line, body in python_blocks(page)]
  return "\n".join(parts)


RUNNABLE_PAGES = [p for p in PAGES if python_blocks(p)]


def test_pages_with_code_are_found():
  names = {p.relative_to(REPO).as_posix() for p in RUNNABLE_PAGES}
  assert {"README.md", "docs/index.md", "docs/quickstart.md", "docs/callbacks.md",
          "docs/reductions.md"} <= names, names


def test_not_runnable_exceptions_exist():
  """Each listed exception still matches a block, so the list cannot go stale."""
  for page, start in NOT_RUNNABLE:
    firsts = [body.strip().splitlines()[0] for _, info, body in blocks(REPO / page)
              if body.strip()]
    assert any(f.startswith(start) for f in firsts), (page, start)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_private_modules(page):
  """Pages show public API only: no batchpart._core (batchpart.testing is the public way to
  its test kernels)."""
  for line, body in python_blocks(page):
    assert not re.search(r"batchpart\._|from batchpart import _", body), (page.name, line)


@pytest.mark.slow
@pytest.mark.timeout(PAGE_TIMEOUT_S + 60)
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_page_runs_as_a_script(page, tmp_path):
  (tmp_path / "page.py").write_text(script(page))
  for path in included_files(page):
    shutil.copy(path, tmp_path / path.name)
  env = {k: v for k, v in os.environ.items()
         if k != "XLA_FLAGS" and not k.startswith("JAX_")}
  proc = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
  assert proc.returncode == 0, (
      f"{page.relative_to(REPO)} exited {proc.returncode}\n--- stdout (end)\n"
      f"{proc.stdout[-3000:]}\n--- stderr (end)\n{proc.stderr[-6000:]}")


SHELL_INFO = re.compile(r"^(bash|sh|shell|console)\s*$")
#: A command that runs the system's Python (no jax there) where the .venv's is meant.
BARE_PYTHON = re.compile(r"(?:^|[\s;&|(`$])python3?\s(?!-m venv)")


def readme_install() -> str:
  """The install command of the README's first shell block, without the demo run after it."""
  body = next(b for _, info, b in blocks(REPO / "README.md") if SHELL_INFO.match(info))
  return body.strip().split(" && .venv/bin/python")[0]


def joined(command: str) -> str:
  """A shell command with its continuation lines (a trailing backslash) joined into one."""
  return re.sub(r"\s*\\\n\s*", " ", command.strip())


@pytest.mark.parametrize("page", ["docs/index.md", "docs/quickstart.md"])
def test_install_is_the_readmes(page):
  """The pages' install is the README's, word for word (split over lines to fit the page)."""
  shell = [b for _, info, b in blocks(REPO / page) if SHELL_INFO.match(info)]
  assert any(joined(b) == readme_install() for b in shell), (page, readme_install())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_commands_use_the_venv(page):
  """Shell blocks and inline commands name the .venv's Python, and an editable install
  builds without isolation (with it, pip rebuilds from scratch each time, silently)."""
  text = page.read_text()
  shell = [b for _, info, b in blocks(page) if SHELL_INFO.match(info)]
  inline = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
  for cmd in [line for b in shell for line in b.splitlines()] + inline:
    assert not BARE_PYTHON.search(cmd), (page.name, cmd)
  for line in (line for b in shell for line in b.splitlines()):
    if re.search(r"\bpip install\b.*\s-e\s", line.split("#")[0]):
      assert ".venv/bin/pip install" in line and "--no-build-isolation" in line, (page.name, line)
