"""Every import inside batchpart runs down its layers.

``LAYERS`` lists the package's units (a subpackage or a top-level module),
bottom first, grouped into layers. A module may import its own unit and any
unit of a lower layer; an import of a unit in its own layer or a higher one
climbs, and the test lists every such import. The imports are read from the
source with ``ast``: module-level ones and those inside functions alike,
``import batchpart.x``, ``from batchpart import x``, relative imports and
``importlib.import_module("batchpart.x")``; ``import batchpart`` (and a name
``from batchpart`` that is no unit) is an import of ``__init__``.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "batchpart"

LAYERS: tuple[tuple[str, ...], ...] = (
    # jax's internals (the only importer of jax._src), the compiled modules
    # and dtype names: they import nothing of batchpart.
    ("_compat", "_core", "_cuda", "_dtypes"),
    # The call's vocabulary: the batch spec, one module per dim kind, the
    # call's description, the derived-name codec, the block each partition
    # gets.
    ("_vocab",),
    # Readers of lowered StableHLO and of compiled HLO text.
    ("_stablehlo", "_hlo"),
    # From a lowered call to per-device calls.
    ("_partition",),
    # The batchpart_ffi_call primitive, its lowering, retargeted foreign calls.
    ("_primitive",),
    # What users call: ffi_call, the decorator, registration, adopting.
    ("_frontend",),
    # Host callbacks per batch shard.
    ("_callback",),
    ("_explain",),
    # batchpart's own kernels, registered as FFI targets, and bp.linalg on them.
    ("_lapack_targets", "_cusolver_targets"),
    ("linalg",),
    # The public names.
    ("__init__",),
    # Clients of the public names.
    ("testing",),
    ("_demo",),
    ("__main__",),
)
_LAYER = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit_of_path(path: pathlib.Path, root: pathlib.Path) -> str:
  """The unit a source file under the package directory ``root`` belongs to."""
  parts = path.relative_to(root).parts
  return parts[0] if len(parts) > 1 else path.stem


def _unit_of_module(dotted: str) -> str | None:
  """The unit an absolute module name imports; None outside batchpart."""
  parts = dotted.split(".")
  if parts[0] != "batchpart":
    return None
  return parts[1] if len(parts) > 1 else "__init__"


def _package_of(path: pathlib.Path, root: pathlib.Path) -> list[str]:
  """The dotted package a source file's relative imports start from."""
  parts = ["batchpart", *path.relative_to(root).with_suffix("").parts]
  return parts if path.name == "__init__.py" else parts[:-1]


def _imported_units(path: pathlib.Path, root: pathlib.Path):
  """(line, what the import names, the unit it imports) for every import of
  batchpart in ``path``."""
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        unit = _unit_of_module(alias.name)
        if unit is not None:
          yield node.lineno, f"import {alias.name}", unit
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        package = _package_of(path, root)
        base = package[:len(package) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
      else:
        module = node.module or ""
      if module == "batchpart":
        # ``from batchpart import x``: the unit x, or a name of __init__.
        for alias in node.names:
          unit = alias.name if alias.name in _LAYER else "__init__"
          yield node.lineno, f"from batchpart import {alias.name}", unit
        continue
      unit = _unit_of_module(module)
      if unit is not None:
        names = ", ".join(alias.name for alias in node.names)
        yield node.lineno, f"from {module} import {names}", unit
    elif (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
          and (getattr(node.func, "attr", None) == "import_module"
               or getattr(node.func, "id", None) in ("import_module", "__import__"))):
      unit = _unit_of_module(node.args[0].value)
      if unit is not None:
        yield node.lineno, f"import_module({node.args[0].value!r})", unit


def _sources(root: pathlib.Path) -> list[pathlib.Path]:
  return sorted(root.rglob("*.py"))


def _climbs(root: pathlib.Path) -> list[str]:
  """Every import in the package at ``root`` that climbs the layers."""
  climbs = []
  for path in _sources(root):
    unit = _unit_of_path(path, root)
    if unit not in _LAYER:
      continue   # test_every_module_has_a_layer names it
    for line, name, target in _imported_units(path, root):
      if target == unit or _LAYER.get(target, len(LAYERS)) < _LAYER[unit]:
        continue
      climbs.append(f"{path.relative_to(root.parent)}:{line}: {name}  "
                    f"[{unit}, layer {_LAYER[unit]} -> {target}, layer "
                    f"{_LAYER.get(target, '?')}]")
  return climbs


def test_every_module_has_a_layer():
  missing = sorted({_unit_of_path(p, PACKAGE) for p in _sources(PACKAGE)} - set(_LAYER))
  assert not missing, f"units without a layer in LAYERS: {missing}"


def test_every_layer_names_a_unit():
  compiled = {"_core", "_cuda"}   # built extension modules, not always present
  present = {_unit_of_path(p, PACKAGE) for p in _sources(PACKAGE)}
  stale = sorted(set(_LAYER) - present - compiled)
  assert not stale, f"LAYERS names units the package does not have: {stale}"


def test_every_import_runs_down_the_layers():
  climbs = _climbs(PACKAGE)
  assert not climbs, (f"{len(climbs)} imports climb the layers:\n  "
                      + "\n  ".join(climbs))


def test_every_form_of_import_is_read(tmp_path):
  """The reader on a made-up package: each form of import that climbs is
  listed, and those that run down or stay in their unit are not."""
  root = tmp_path / "batchpart"
  (root / "_partition").mkdir(parents=True)
  (root / "_partition" / "__init__.py").write_text("from . import plan\n")
  (root / "_partition" / "plan.py").write_text(
      "import batchpart._primitive.lowering\n"
      "from batchpart import _callback, _vocab\n"
      "from batchpart import ffi_call\n"
      "from .. import _explain\n"
      "from ..linalg import cholesky\n"
      "from . import shardings\n"
      "from batchpart._vocab.batch_spec import BatchSpec\n"
      "def f():\n"
      "  import importlib\n"
      "  from batchpart._frontend import adopt\n"
      "  return importlib.import_module('batchpart.testing')\n")
  climbs = [c.split("  [")[0] for c in _climbs(root)]
  assert climbs == [
      "batchpart/_partition/plan.py:1: import batchpart._primitive.lowering",
      "batchpart/_partition/plan.py:2: from batchpart import _callback",
      "batchpart/_partition/plan.py:3: from batchpart import ffi_call",
      "batchpart/_partition/plan.py:4: from batchpart import _explain",
      "batchpart/_partition/plan.py:5: from batchpart.linalg import cholesky",
      "batchpart/_partition/plan.py:10: from batchpart._frontend import adopt",
      "batchpart/_partition/plan.py:11: import_module('batchpart.testing')",
  ]
