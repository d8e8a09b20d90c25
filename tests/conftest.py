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
