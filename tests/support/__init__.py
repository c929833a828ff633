"""What the tests share: float64 references of each op and their tolerances
(`*_reference.py`, `check_close`), random cases (`*_cases.py`), graphs and
checks the tests build on, sessions on HinaMoE or the CPU EP
(`sessions.py`), what this onnxruntime and CPU run (`runtime.py`), and the
per-run seed (`seeds.py`). pytest puts `tests/` on the path
(pyproject.toml), so a test imports `from support.sessions import ...`."""

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent
