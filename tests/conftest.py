import jax
import pytest

import batchpart.testing

batchpart.testing.register()


@pytest.fixture(scope="module")
def x64():
  """64-bit jax types for one module: `pytestmark = pytest.mark.usefixtures("x64")`."""
  with jax.enable_x64(True):
    yield
