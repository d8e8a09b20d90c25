"""A two-process jax.distributed job (gloo, 4 CPU devices per process) with a
halo dim split across the processes: the devices at the processes' border
exchange their edge slabs across them, and every part equals the unsharded
stencil's bit for bit, with the boundary rule unstated and stated."""

import os

import jax
import numpy as np
import pytest

from batchpart import _hlo, testing as kernels

from helpers import run_two_processes

WORKER = os.path.join(os.path.dirname(__file__), "halo_multiprocess_worker.py")


@pytest.mark.timeout(300)
def test_halo_exchanges_cross_the_processes(tmp_path):
  out = str(tmp_path / "results")
  run_two_processes(WORKER, out)
  x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
  attrs = dict(rank=np.int64(1), lo=np.int64(2), hi=np.int64(1),
               mode=np.int64(kernels.HALO_MODES["reflect"]))
  want = np.asarray(jax.ffi.ffi_call("batchpart_test_stencil",
                                     jax.ShapeDtypeStruct(x.shape, x.dtype))(x, **attrs))
  for i in range(2):
    r = np.load(f"{out}.{i}.npz")
    assert list(r["starts"]) == [8 * k for k in range(4 * i, 4 * i + 4)]
    for start, part, stated in zip(r["starts"], r["values"], r["values_ends"]):
      np.testing.assert_array_equal(part, want[:, start:start + 8])
      np.testing.assert_array_equal(stated, want[:, start:start + 8])
    kinds = {c.opcode for c in _hlo.collectives(str(r["hlo"]))}
    assert kinds == {"collective-permute"}, kinds
