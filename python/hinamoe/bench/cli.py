"""Command line entry point: ``hina-bench <subcommand> [options]``.

Each subcommand is a module with ``NAME``, ``HELP``, ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``; add new ones to
``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import cpu_mask

# subcommand name -> module (relative to this package)
SUBCOMMANDS = {
    "ffn": ".ffn",
    "decode": ".decode",
    "gqa": ".gqa",
    "numa-plan": ".numa_plan",
    "serve": ".serve",
    "serve-soak": ".serve_soak",
}


def csv(kind):
    """argparse type for a comma-separated list of `kind`."""
    def parse(text: str):
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        try:
            return [kind(s) for s in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hina-bench",
        description=(
            "Benchmarks for the HinaMoE ONNX Runtime execution provider. Each "
            "subcommand times one kind of node at real model shapes, side by side "
            "with ONNX Runtime's own CPU EP, and reports effective memory bandwidth "
            "against the machine's measured read bandwidth."),
        epilog="Run 'hina-bench <subcommand> --help' for the options of a subcommand.",
    )
    parser.add_argument(
        "--cpu-as", choices=cpu_mask.LEVELS, default=None, metavar="LEVEL",
        help="run as on a CPU whose instruction sets stop at LEVEL (avx2 or avx512): "
             "CPUID hides the rest from the whole process, so ORT's CPU EP and "
             "HinaMoE's auto pick the kernels of such a CPU (Linux x86-64 with CPUID "
             "faulting; see hinamoe/bench/cpu_mask.py)")
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    sub.required = True
    for name, modname in SUBCOMMANDS.items():
        mod = importlib.import_module(modname, __package__)
        p = sub.add_parser(name, help=mod.HELP, description=mod.DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cpu_as:
        if cpu_mask.active() != args.cpu_as:
            cpu_mask.reexec(args.cpu_as, sys.argv[1:] if argv is None else list(argv))
        print(cpu_mask.verify(args.cpu_as))
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
