"""The module against the numpy it meets, and the build that makes it
(docs/torch.md, "Which torch, numpy and pybind11"):

- float32 buffers of this interpreter's numpy (1.x or 2.x) are read as
  float32 and other dtypes are refused by name: a module built with a
  pybind11 before 2.12 misread every numpy 2 dtype ("initial.dtype =
  "float32": must be float32");
- the module is built with the interpreter's own pybind11 when it has one,
  not with a system one (cmake/ashlPybind11.cmake), and such an old module
  refuses to load under numpy 2 instead of misreading;
- a configure without pybind11, or with a pybind11 too old for the
  interpreter's numpy, fails naming it (it used to end in `ninja: error:
  unknown target 'ashl_python'`);
- `pip install .` asks for cmake and ninja only when they are missing
  (python/backend/ashl_backend.py)."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ashl._ashl as native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _version(text):
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.?(\d*)", text).groups() if x)


def test_float32_buffers_of_this_numpy_are_read_as_float32():
    x = np.arange(6, dtype=np.float32)
    assert native.all_finite(x)
    x[3] = np.inf
    assert not native.all_finite(x)
    # The server takes its initial parameters as a float32 buffer too (the
    # call that failed first under numpy 2).
    server = native.Server(size=4, initial=np.full(4, 0.5, dtype=np.float32), policy="bsp", workers=1,
                           fabric=native.InprocFabric(), listen="build-test", insecure=True)
    assert np.array_equal(server.parameters(), np.full(4, 0.5, dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.uint32])
def test_other_dtypes_are_refused_naming_the_dtype(dtype):
    with pytest.raises(ValueError) as e:
        native.all_finite(np.zeros(4, dtype=dtype))
    assert f'x.dtype = "{np.dtype(dtype)}": must be float32' in str(e.value)


def test_strided_float32_is_refused_as_strided_not_as_a_dtype():
    with pytest.raises(ValueError, match=r"x\.stride = 8: must be 4 bytes"):
        native.all_finite(np.zeros(8, dtype=np.float32)[::2])


def test_module_was_built_with_this_interpreters_pybind11():
    if importlib.util.find_spec("pybind11") is None:
        pytest.skip(f"{sys.executable} has no pybind11 of its own (a system one, such as pybind11-dev, is used)")
    import pybind11
    assert native.pybind11_version == pybind11.__version__, (
        f"ashl._ashl ({native.__file__}) was built with pybind11 {native.pybind11_version}, "
        f"not with this interpreter's {pybind11.__version__}")


def test_a_module_from_a_pybind11_before_2_12_refuses_numpy_2_at_import(tmp_path):
    # A stand-in numpy that says it is 2.4.6, first on the path: the module
    # asks numpy's version at import only when its pybind11 cannot read numpy 2.
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text('__version__ = "2.4.6"\n')
    package_parent = os.path.dirname(os.path.dirname(native.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), package_parent]))
    done = subprocess.run([sys.executable, "-c", "import ashl._ashl as m; print(m.pybind11_version)"],
                          env=env, capture_output=True, text=True, timeout=60)
    if _version(native.pybind11_version) < (2, 12):
        assert done.returncode != 0
        assert (f"ashl._ashl was built with pybind11 {native.pybind11_version}, "
                "which cannot read numpy 2.4.6's arrays") in done.stderr
        assert "pip install 'pybind11>=2.12'" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == native.pybind11_version


def _bare_interpreter(tmp_path):
    """A venv of this interpreter without pip or any package: no pybind11."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return python, site


def _configure(tmp_path, *args):
    """Configures python/ as `pip install .` does (top level); returns (rc, output)."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("no cmake or c++ on PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("pybind11", "CMAKE_", "PYTHONPATH"))}
    env["PATH"] = "/usr/bin:/bin"
    done = subprocess.run(["cmake", "-S", os.path.join(ROOT, "python"), "-B", str(tmp_path / "build"),
                           "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", *args],
                          env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, " ".join((done.stdout + done.stderr).split())  # CMake wraps its messages


def test_configure_without_pybind11_fails_naming_it(tmp_path):
    python, _ = _bare_interpreter(tmp_path)
    # No pybind11 in the interpreter, and none on the system prefixes either.
    rc, out = _configure(tmp_path, f"-DPython_EXECUTABLE={python}", "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local;/")
    assert rc != 0, out
    assert f"ashl: cannot build the Python module: pybind11 not found for {python}" in out
    assert "pip install 'pybind11>=2.12'" in out
    assert "unknown target" not in out


def _system_pybind11():
    for d in ("/usr/lib/cmake/pybind11", "/usr/local/lib/cmake/pybind11", "/usr/share/cmake/pybind11"):
        f = os.path.join(d, "pybind11ConfigVersion.cmake")
        if os.path.exists(f):
            m = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', open(f).read())
            if m:
                return d, m.group(1)
    return None, None


def test_configure_refuses_a_pybind11_before_2_12_with_numpy_2(tmp_path):
    system_dir, system_version = _system_pybind11()
    if system_dir is None or _version(system_version) >= (2, 12):
        pytest.skip("needs a system pybind11 before 2.12 (Debian 12's pybind11-dev 2.10)")
    python, site = _bare_interpreter(tmp_path)
    os.makedirs(os.path.join(site, "numpy"))
    with open(os.path.join(site, "numpy", "__init__.py"), "w") as f:
        f.write('__version__ = "2.4.6"\n')
    rc, out = _configure(tmp_path, f"-DPython_EXECUTABLE={python}")
    assert rc != 0, out
    assert (f"pybind11 {system_version} ({system_dir}) cannot read numpy 2.4.6's arrays ({python}); "
            "with numpy 2 it takes pybind11 >= 2.12") in out
    assert "unknown target" not in out


def _lookup(tmp_path, python, *args, body=None):
    """Runs only cmake/ashlPybind11.cmake in a project without languages;
    returns the pybind11 it chose as (version, source, dir). `body` replaces
    the lookup (a build directory as an earlier version left it)."""
    if shutil.which("cmake") is None:
        pytest.skip("no cmake on PATH")
    src = tmp_path / "lookup"
    src.mkdir(exist_ok=True)
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.24)
        project(lookup NONE)
        include({ROOT}/cmake/ashlPybind11.cmake)
        """) + (body or textwrap.dedent("""\
        ashl_find_pybind11(problem)
        message(STATUS "chose|${pybind11_VERSION}|${ASHL_PYBIND11_SOURCE}|${pybind11_DIR}|${problem}")
        """)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("pybind11", "CMAKE_"))}
    done = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "lookup-build"),
                           f"-DPython_EXECUTABLE={python}", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    if body is not None:
        return None
    return re.search(r"chose\|([^|]*)\|([^|]*)\|([^|]*)\|", done.stdout).groups()


def _fake_pybind11(site, version):
    """A pybind11 package whose --cmakedir is a config of the given version."""
    pkg = os.path.join(site, "pybind11")
    cmakedir = os.path.join(pkg, "share", "cmake", "pybind11")
    os.makedirs(cmakedir)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(f'__version__ = "{version}"\n')
    with open(os.path.join(pkg, "__main__.py"), "w") as f:
        f.write(f"print({cmakedir!r})\n")
    with open(os.path.join(cmakedir, "pybind11ConfigVersion.cmake"), "w") as f:
        f.write(f'set(PACKAGE_VERSION "{version}")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')
    with open(os.path.join(cmakedir, "pybind11Config.cmake"), "w") as f:
        f.write("# a stand-in: defines nothing\n")
    return cmakedir


def test_lookup_prefers_the_interpreters_pybind11_over_the_systems(tmp_path):
    python, site = _bare_interpreter(tmp_path)
    cmakedir = _fake_pybind11(site, "9.8.7")
    version, source, chosen = _lookup(tmp_path, python)
    assert (version, source, chosen) == ("9.8.7", "interpreter", cmakedir)


def test_lookup_takes_an_explicit_pybind11_dir_over_the_interpreters(tmp_path):
    python, site = _bare_interpreter(tmp_path)
    _fake_pybind11(site, "9.8.7")
    other = tmp_path / "other"
    explicit = _fake_pybind11(str(other), "9.1.0")
    version, source, chosen = _lookup(tmp_path, python, f"-Dpybind11_DIR={explicit}")
    assert (version, source, chosen) == ("9.1.0", "explicit", explicit)


def test_lookup_replaces_a_pybind11_dir_cached_before_it_existed(tmp_path):
    # A build directory from before this lookup: find_package cached some
    # other pybind11 (the system's, say), with no record of how it came.
    python, site = _bare_interpreter(tmp_path)
    cmakedir = _fake_pybind11(site, "9.8.7")
    old = _fake_pybind11(str(tmp_path / "old"), "2.10.3")
    _lookup(tmp_path, python, body=f'set(pybind11_DIR "{old}" CACHE PATH "found by find_package")\n')
    version, source, chosen = _lookup(tmp_path, python)
    assert (version, source, chosen) == ("9.8.7", "interpreter", cmakedir)
    # ... and a pybind11_DIR given at the first configure stays explicit.
    again = tmp_path / "again"
    again.mkdir()
    version, source, chosen = _lookup(again, python, f"-Dpybind11_DIR={old}")
    assert (version, source, chosen) == ("2.10.3", "explicit", old)


def test_lookup_falls_back_to_the_system_pybind11(tmp_path):
    system_dir, system_version = _system_pybind11()
    if system_dir is None:
        pytest.skip("no system pybind11 (pybind11-dev)")
    python, _ = _bare_interpreter(tmp_path)
    version, source, chosen = _lookup(tmp_path, python)
    assert (version, source, os.path.realpath(chosen)) == (system_version, "system", os.path.realpath(system_dir))


def _backend_tools(tmp_path, path):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip(f"{sys.executable} has no setuptools")
    done = subprocess.run([sys.executable, "-c", "import ashl_backend; print(ashl_backend.build_tools())"],
                          env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python", "backend"), PATH=path,
                                   ASHL_PREBUILT=""),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pip_install_asks_for_cmake_and_ninja_only_when_missing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert _backend_tools(tmp_path, str(bin_dir)) == "['cmake>=3.24', 'ninja']"
    old = bin_dir / "cmake"
    old.write_text("#!/bin/sh\necho 'cmake version 3.18.4'\n")
    old.chmod(0o755)
    assert _backend_tools(tmp_path, str(bin_dir)) == "['cmake>=3.24', 'ninja']"  # too old for python/CMakeLists.txt
    old.write_text("#!/bin/sh\necho 'cmake version 3.25.1'\n")
    (bin_dir / "ninja").write_text("#!/bin/sh\n")
    (bin_dir / "ninja").chmod(0o755)
    assert _backend_tools(tmp_path, str(bin_dir)) == "[]"
