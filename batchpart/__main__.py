"""Command line: ``python -m batchpart demo``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m batchpart")
  commands = parser.add_subparsers(dest="command", required=True)
  demo = commands.add_parser(
      "demo", help="batched Cholesky through batchpart and the alternatives, on 8 "
      "simulated CPU devices")
  demo.add_argument("--devices", type=int, default=8)
  demo.add_argument("--repeats", type=int, default=10)
  demo.add_argument("--batch", type=int, default=512)
  demo.add_argument("--size", type=int, default=32)
  args = parser.parse_args(argv)
  if args.command == "demo":
    from batchpart import _demo
    return _demo.run(num_devices=args.devices, repeats=args.repeats, batch=args.batch,
                     n=args.size)
  return 1


if __name__ == "__main__":
  sys.exit(main())
