"""pytest settings of test/python: the gpu marker (tests that need a CUDA
device; they skip without one: `python3 -m pytest -m gpu` runs them alone)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skips without one; bench/gpu/run.sh runs them)")
