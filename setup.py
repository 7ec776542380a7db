"""Builds ashl._ashl (and the native ashl-run) with CMake for `pip install .`;
the metadata (and the console script ashl-run -> ashl.run:main) is in
pyproject.toml. CMake finds the pybind11 of this interpreter first
(cmake/ashlPybind11.cmake: Python_EXECUTABLE is sys.executable, the
interpreter pip runs this with) and fails naming what is missing. Environment: ASHL_CMAKE_ARGS (extra configure arguments,
space-separated), ASHL_BUILD_JOBS (parallel build jobs, default 2),
ASHL_PREBUILT (a package directory an earlier build made, such as
build/release/python/ashl: its module and bin/ashl-run are copied instead of
building; packaging an existing build, and the install test)."""
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
        prebuilt = os.environ.get("ASHL_PREBUILT")
        if prebuilt:
            self.copy_prebuilt(Path(prebuilt), package_dir, Path(self.get_ext_fullpath(ext.name)).name)
            return
        cmake = shutil.which("cmake")
        if cmake is None:
            # pip fetches cmake itself when it builds in isolation
            # (python/backend); --no-build-isolation leaves it to the machine.
            raise SystemExit("ashl: cmake (3.24 or later) is not on PATH: pip install cmake, or apt-get install cmake")
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [cmake, "-S", str(ROOT / "python"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", f"-DASHL_PYTHON_PACKAGE_DIR={package_dir}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("ASHL_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = os.environ.get("ASHL_BUILD_JOBS", "2")
        subprocess.run([cmake, "--build", str(build_dir), "--target", "ashl_python", "-j", jobs], check=True)

    @staticmethod
    def copy_prebuilt(src: Path, package_dir: Path, module_name: str) -> None:
        modules = sorted(src.glob("_ashl*.so")) + sorted(src.glob("_ashl*.pyd"))
        if not modules:
            raise SystemExit(f"ASHL_PREBUILT = '{src}': no _ashl module there (build the ashl_python target first)")
        package_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(modules[0], package_dir / module_name)
        native_run = src / "bin" / "ashl-run"
        if native_run.exists():
            (package_dir / "bin").mkdir(exist_ok=True)
            shutil.copy2(native_run, package_dir / "bin" / "ashl-run")


setup(ext_modules=[CMakeExtension("ashl._ashl")], cmdclass={"build_ext": CMakeBuild})
