# Installed by the hinamoe wheel as optimum/commands/register/register_hina.py:
# optimum-cli reads REGISTER_COMMANDS from every file here (no __init__.py, PEP 420).
# Adds `optimum-cli export hina MODEL_DIR OUTPUT_DIR ...` (same as hina-export).
try:
    from optimum.commands.export.base import ExportCommand

    from hinamoe.export.optimum_command import HinaExportCommand
except ImportError as e:  # hinamoe's export extra missing: leave optimum-cli working
    import warnings

    warnings.warn(f"optimum-cli export hina unavailable: {e}", stacklevel=1)
    REGISTER_COMMANDS = []
else:

    class _ReadOnce(list):
        """optimum-cli imports this file once per directory of the
        optimum.commands.register namespace, by one module name: a venv with
        --system-site-packages where both site-packages hold hinamoe lists it
        twice, gets this same module twice and would add `export hina` twice
        (argparse: "conflicting subparser: hina", breaking every command).
        So the commands are handed out on the first read only."""

        def __iter__(self):
            items = list.copy(self)  # not list(self): that would call this again
            del self[:]
            return iter(items)

    REGISTER_COMMANDS = _ReadOnce([(HinaExportCommand, ExportCommand)])
