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
    REGISTER_COMMANDS = [(HinaExportCommand, ExportCommand)]
