"""Runs pytest on test/python: for ctest (python/pytest, Debian's torch and
numpy) and for scripts/test-torch2 (torch 2.x and numpy 2 in a venv). Exit
77 (skipped) when this interpreter lacks torch, numpy or pytest, with the
reason. Usage: run_pytest.py [test dir] [pytest arguments]. First it prints
which run this is (ASHL_SUITE_RUN) and the versions it runs with, so the two
runs are told apart in a log."""
import importlib.util
import os
import sys

missing = [m for m in ("pytest", "torch", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: {sys.executable} has no {', '.join(missing)} (python3-pytest python3-torch python3-numpy)")
    sys.exit(77)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
# Ctrl-C as a terminal gives it, whoever started this: a shell runs
# background jobs (scripts/test runs the torch 2.x stage as one) with SIGINT
# ignored, children inherit that, and test_lifetimes.py's children would then
# ignore the SIGINT they are sent. A Python handler here is reset to the
# default in every child at exec, where Python installs its own.
import signal  # noqa: E402

signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

try:
    import ashl._ashl as native
    module = f"ashl from {os.path.dirname(native.__file__)} (built with pybind11 {native.pybind11_version})"
except Exception as e:  # the suite itself reports it, test by test
    module = f"ashl does not import: {e}"
run = os.environ.get("ASHL_SUITE_RUN", "system")
print(f"=== ashl python suite [{run}]: python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, "
      f"numpy {numpy.__version__}, {module}", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1] if len(sys.argv) > 1 else "."] + sys.argv[2:]))
