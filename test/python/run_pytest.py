"""Runs pytest on test/python for ctest (python/pytest): exit 77 (skipped)
when this interpreter lacks torch, numpy or pytest, with the reason."""
import importlib.util
import sys

missing = [m for m in ("pytest", "torch", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: {sys.executable} has no {', '.join(missing)} (python3-pytest python3-torch python3-numpy)")
    sys.exit(77)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1] if len(sys.argv) > 1 else "."]))
