"""Multi-device tests: 8 simulated CPU devices.

Run as their own pytest process (``pytest multidevice_tests``): the device
count is read once, when the CPU backend starts. It is set through jax's
config rather than XLA_FLAGS, so subprocesses a test starts see no inherited
device count and set their own.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import batchpart.testing  # noqa: E402

# XLA's CPU runtime has been seen to hang on simulated devices when programs
# mixing collectives and FFI calls run many times with async dispatch on
# (docs/faq.md); the tests dispatch synchronously and each has a timeout.
jax.config.update("jax_cpu_enable_async_dispatch", False)
batchpart.testing.register()


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
  """Runs a test under both of XLA's partitioners."""
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  yield request.param
  jax.config.update("jax_use_shardy_partitioner", previous)


@pytest.fixture
def x64():
  """float64 and int64 arrays stay what they are (``pytestmark =
  pytest.mark.usefixtures("x64")`` for a whole module)."""
  with jax.enable_x64(True):
    yield


@pytest.fixture
def mesh8():
  return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


@pytest.fixture
def mesh2x4():
  return jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture
def explicit_mesh2x4():
  """The 2x4 mesh in Explicit mode, for results typed with their sharding
  (under ``jax.set_mesh``)."""
  return jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)


def pytest_configure(config):
  assert jax.device_count() == 8, "multidevice_tests need 8 simulated devices"
