"""Builds ashl._ashl (and ashl-run) with CMake for `pip install .`; the
metadata is in pyproject.toml. Environment: ASHL_CMAKE_ARGS (extra configure
arguments, space-separated), ASHL_BUILD_JOBS (parallel build jobs, default 2)."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = ["cmake", "-S", str(ROOT / "python"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", f"-DASHL_PYTHON_PACKAGE_DIR={package_dir}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("ASHL_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = os.environ.get("ASHL_BUILD_JOBS", "2")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "ashl_python", "-j", jobs], check=True)


setup(ext_modules=[CMakeExtension("ashl._ashl")], cmdclass={"build_ext": CMakeBuild})
