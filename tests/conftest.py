import jax
import pytest

import batchpart.testing

batchpart.testing.register()


@pytest.fixture(scope="module")
def x64():
  """64-bit jax types for one module: `pytestmark = pytest.mark.usefixtures("x64")`."""
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module")
def lapack_registered():
  """The CPU LAPACK targets registered with XLA, for one module:
  `pytestmark = pytest.mark.usefixtures("lapack_registered")`."""
  from batchpart import _lapack_targets
  _lapack_targets.register()


def _needs_a_gpu(item) -> bool:
  """Whether a test runs only on a CUDA device: it takes the ``gpu`` fixture or
  its module skips without one (test_cuda_sharding.py)."""
  return "gpu" in getattr(item, "fixturenames", ()) or item.path.name == "test_cuda_sharding.py"


# The small-matrix kernels' exhaustive sweeps: every dtype x flag x size of the
# interleaved kernels against the per-matrix path and NumPy. They test C++ that
# no jax version changes, so CI runs them once (`-m slow`, pyproject.toml).
_SWEEPS = frozenset({
    "test_interleaved_packing.py", "test_lapack_kernels.py", "test_small_cholesky.py",
    "test_small_eigh.py", "test_small_lu.py", "test_small_qr.py",
    "test_small_triangular_solve.py"})


def pytest_collection_modifyitems(config, items):
  """Marks the sweeps ``slow``. Without a CUDA device the device tests are not
  collected, and one line of the summary says so (pytest_terminal_summary),
  instead of a skip per test."""
  for item in items:
    if item.path.name in _SWEEPS:
      item.add_marker(pytest.mark.slow)
  from batchpart import _cusolver_targets
  if _cusolver_targets.has_cuda_devices():
    return
  gpu_only = [item for item in items if _needs_a_gpu(item)]
  if gpu_only:
    config.hook.pytest_deselected(items=gpu_only)
    items[:] = [item for item in items if not _needs_a_gpu(item)]
  config.stash[_GPU_TESTS] = len(gpu_only)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
  count = config.stash.get(_GPU_TESTS, 0)
  if count:
    terminalreporter.write_line(
        f"{count} GPU tests not run: no CUDA device here (they run on a GPU machine: "
        "docs/gpu.md).")


_GPU_TESTS = pytest.StashKey[int]()
