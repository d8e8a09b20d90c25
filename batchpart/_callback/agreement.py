"""Devices holding only padding fail with the devices whose callback failed.

XLA's CPU runtime stops a device's program at the first custom call that
returns an error: that device skips every later op, collectives included,
while the other devices go on into the next collective and wait there until
XLA's rendezvous timeout (40 s) ends the process. A device whose block is
all padding calls nothing (13 rows over 8 devices: the eighth; a call with
no batch dims: all but one), so without more it would go on even where the
callback failed on every device that called it.

So each call of a partitioned callback ``settle``s its round (the calls of
one execution, one per device) with its outcome, and a call on padding waits
until every call of its round has settled, then fails with the round's error
if there is one; calls that run the user's function never wait. A failure on
every computing device (a raising callback, a result of the wrong shape or
dtype) fails every device, and none is left in a collective. A failure on
*some* computing devices still leaves the others going on: telling them
would take every call waiting for every other, which starves XLA's CPU
client (its device programs and their launches share one pool of about one
thread per device) and hangs loops of programs that work without it.

Waiting holds a thread of that pool, so at most one round in the process
waits at a time: a padding call that settles while another round waits
returns at once, and its round gives up agreeing. A round in which no call
settles for ``STALL_SECONDS`` gives up too: a device whose program failed
before the callback never comes, and XLA itself gives up on a collective
after 40 s.
"""

from __future__ import annotations

import threading
import time

from batchpart._callback.errors import CallbackError

STALL_SECONDS = 40.0

# One condition for every callback's rounds: "at most one round waits" is
# process-wide, since all of them draw on the same thread pool.
_cond = threading.Condition(threading.Lock())
_waiting: list = [None]   # the round whose calls wait, if any


class _Round:
  """The calls of one execution of a callback, one per device."""

  __slots__ = ("number", "settled", "waits", "done", "gave_up", "progress", "failure")

  def __init__(self, number=None):
    self.number = number     # its place among a keyed agreement's rounds
    self.settled = 0
    self.waits = 0           # calls on padding among them
    self.done = False        # every call settled
    self.gave_up = False     # some call returned without the others
    self.progress = time.monotonic()
    self.failure: tuple | None = None   # (order key, error)


class Agreement:
  """Rounds of ``participants`` calls, one per device. ``keyed``: each
  device's calls carry a key of their own (its block vector), so a device's
  k-th call joins round k even where executions overlap; without, a round
  is the next ``participants`` calls (devices that share a block).

  ``needed`` turns False once a round had no call on padding: then no
  device of the program holds only padding, and calls skip the rounds."""

  __slots__ = ("participants", "keyed", "stall_seconds", "needed", "_open", "_calls",
               "_rounds", "_floor")

  def __init__(self, participants: int, *, keyed: bool,
               stall_seconds: float = STALL_SECONDS):
    self.participants = int(participants)
    self.keyed = bool(keyed)
    self.stall_seconds = float(stall_seconds)
    self.needed = True
    self._open = _Round()
    self._calls: dict = {}     # key -> calls so far
    self._rounds: dict = {}    # round number -> round, until every call settled
    self._floor = 0            # the first round a device's next call may join

  def settle(self, key, error: BaseException | None, order=(), *,
             wait: bool) -> BaseException | None:
    """This call's outcome, ``error`` (None: it succeeded), in its round
    (``key``: its device's block vector). With ``wait`` (a call on padding),
    once every call of the round has settled: the round's error (the failed
    call with the smallest ``order``, the first block in batch order) or
    None; without, or where the round gave up: ``error``."""
    with _cond:
      r = self._join(key)
      if error is not None and (r.failure is None or order < r.failure[0]):
        r.failure = (order, error)
      r.settled += 1
      r.waits += bool(wait)
      r.progress = time.monotonic()
      if r.settled >= self.participants:
        self._finish(r)
      if not wait or r.gave_up:
        return error
      if not r.done:
        if _waiting[0] is not None and _waiting[0] is not r:
          r.gave_up = True
          return error
        _waiting[0] = r
        self._wait(r)
      return None if r.failure is None else r.failure[1]

  def _join(self, key) -> _Round:
    """The round of this call: its device's next (keyed), else the open one."""
    if not self.keyed:
      return self._open
    n = max(self._calls.get(key, 0), self._floor)
    self._calls[key] = n + 1
    r = self._rounds.get(n)
    if r is None:
      r = self._rounds[n] = _Round(n)
    return r

  def _finish(self, r: _Round) -> None:
    """Every call of ``r`` settled: wake its waiting calls, drop it."""
    r.done = True
    if not r.waits:
      self.needed = False
    self._release(r)
    self._rounds.pop(r.number, None)
    _cond.notify_all()

  def _release(self, r: _Round) -> None:
    """``r`` ended (settled or given up): no longer the round that waits,
    nor the one unkeyed calls join."""
    if _waiting[0] is r:
      _waiting[0] = None
    if self._open is r:
      self._open = _Round()

  def _wait(self, r: _Round) -> None:
    """Waits until every call of ``r`` settled, or gives up on a round in
    which no call settled for ``stall_seconds``."""
    while not r.done and not r.gave_up:
      left = r.progress + self.stall_seconds - time.monotonic()
      if left <= 0:
        self._stall(r)
        return
      _cond.wait(left)

  def _stall(self, r: _Round) -> None:
    """Gives up on ``r``'s missing calls: a device whose program stopped
    before the callback skips that round, and later calls start afresh
    (else every later round would wait for its call in vain)."""
    r.gave_up = True
    self._release(r)
    if r.number is not None:
      self._floor = max(self._floor, r.number + 1)
      for n in [n for n in self._rounds if n < self._floor]:
        self._rounds[n].gave_up = True
        del self._rounds[n]
    _cond.notify_all()


def together(agreement: Agreement, owner: str, call, key, start, *, wait: bool):
  """``call()`` as one device's part of a round of ``agreement`` (``key``:
  the device's block vector): its result, or its error; with ``wait`` (a
  block of padding, where nothing is called) the round's error where the
  devices that called failed, so that it fails with them (``start()``:
  this block's place, which orders errors)."""
  try:
    out = call()
  except BaseException as e:
    own = e if isinstance(e, CallbackError) else CallbackError(
        f"{owner} raised {type(e).__name__}: {e}")
    agreed = agreement.settle(key, own, _order_key(start), wait=wait)
    if agreed is own or agreed is None:
      raise
    raise _agreed_error(agreed) from None
  agreed = agreement.settle(key, None, wait=wait)
  if agreed is not None:
    raise _agreed_error(agreed) from None
  return out


def _order_key(start) -> tuple:
  """``start()``, or () where the block vector cannot be read."""
  try:
    return start()
  except Exception:   # a malformed block vector: order it first
    return ()


def _agreed_error(agreed: BaseException) -> CallbackError:
  """The error a device raises for another device's failure in its round:
  the same message, so that whichever device XLA reports, the user reads
  the first failing block's."""
  return CallbackError(str(agreed))
