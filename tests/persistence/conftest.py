"""Lets the persistence tests import their factories and the cache tests' factories (importlib mode)."""

import sys
from pathlib import Path

_HERE = Path(__file__).parent
for folder in (_HERE, _HERE.parent / "cache"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
