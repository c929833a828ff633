"""``python -m hinamoe.bench`` is ``hina-bench``."""
import sys

from .cli import main

sys.exit(main())
