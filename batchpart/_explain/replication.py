"""How many devices compute each batch element of a call."""

from __future__ import annotations

import itertools
import math


def replication(n: int, global_operands, global_results, device_operands,
                device_results, num_batch_dims: int | None,
                leading_core_dims=None) -> int | None:
  """n / (number of distinct batch shards the call runs on).

  The reference array is the call's largest result (its largest operand if
  it has none). Its batch dims are the first ``num_batch_dims`` dims, or, for
  a call without the attribute, all of them. Along each dim with global size
  G and per-device size L the number of shards k satisfies ceil(G / k) == L
  (XLA pads uneven shards); the shard counts must multiply to a divisor of n.
  When padding leaves several choices (a dim smaller than the number of
  devices), the finest sharding is assumed. ``leading_core_dims`` (operands',
  results') shifts the batch dims behind each array's leading core dims.
  """
  leads = leading_core_dims or ((), ())
  if global_results and device_results and len(global_results) == len(device_results):
    pairs = list(zip(global_results, device_results, leads[1] or [0] * len(global_results)))
  elif global_operands and device_operands and len(global_operands) == len(device_operands):
    pairs = list(zip(global_operands, device_operands,
                     leads[0] or [0] * len(global_operands)))
  else:
    return None if num_batch_dims != 0 else n
  g, local, lead = max(pairs, key=lambda p: math.prod(p[0]))
  if len(g) != len(local):
    return None
  dims = range(len(g)) if num_batch_dims is None else range(
      min(lead, len(g)), min(lead + num_batch_dims, len(g)))
  divisors = [k for k in range(1, n + 1) if n % k == 0]
  choices = []
  for d in dims:
    global_size, local_size = g[d], local[d]
    if local_size == global_size:
      choices.append([1])
    elif local_size <= 0 or local_size > global_size:
      return None
    else:
      ks = [k for k in divisors if -(-global_size // k) == local_size]
      if not ks:
        return None
      choices.append(ks)
  best = None
  for combo in itertools.product(*choices):
    shards = math.prod(combo)
    if n % shards == 0 and (best is None or shards > best):
      best = shards
  return None if best is None else n // best
