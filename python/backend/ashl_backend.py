"""The PEP 517 build backend of `pip install .` (pyproject.toml): setuptools'
own, which runs setup.py (CMake on python/CMakeLists.txt), plus the build
tools that pip must fetch because this machine has none that will do:
cmake 3.24 or later and ninja, each asked for only when not on PATH (a
cmake from PyPI is a 30 MB download that a Debian machine does not need).
pybind11 is a static requirement in pyproject.toml: the module must be built
with the pybind11 of the environment that has its numpy (docs/torch.md).
With ASHL_PREBUILT (setup.py) nothing is compiled and no tool is needed."""
import os
import re
import shutil
import subprocess

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook we do not change)

CMAKE_MIN = (3, 24)  # python/CMakeLists.txt's cmake_minimum_required


def _cmake_version(cmake):
    try:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def build_tools():
    """The build tools this machine lacks, as requirements for pip."""
    if os.environ.get("ASHL_PREBUILT"):
        return []
    need = []
    cmake = shutil.which("cmake")
    version = _cmake_version(cmake) if cmake else None
    if version is None or version < CMAKE_MIN:
        need.append("cmake>=%d.%d" % CMAKE_MIN)
    if shutil.which("ninja") is None:
        need.append("ninja")
    return need


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + build_tools()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + build_tools()
