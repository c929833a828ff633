"""`optimum-cli export hina ...`: hina-export as an optimum-cli subcommand.

optimum-cli collects REGISTER_COMMANDS from every ``register_*.py`` in the
PEP 420 namespace ``optimum.commands.register``; our wheel installs
``optimum/commands/register/register_hina.py`` (from python/optimum_commands/register/)
which points here, the same way optimum-onnx adds ``export onnx``.
"""

from __future__ import annotations

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

from .cli import DESCRIPTION, add_arguments, run


class HinaExportCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="hina", help=DESCRIPTION)

    @staticmethod
    def parse_args(parser):
        add_arguments(parser)

    def run(self):
        code = run(self.args)
        if code:
            raise SystemExit(code)
