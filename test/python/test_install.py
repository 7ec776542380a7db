"""`pip install` of the package puts the console script ashl-run on PATH
(pyproject.toml [project.scripts]: ashl.run:main) next to the native
ashl-run inside the package, and the console script starts a job with the
token in the environment only. Offline: pip installs from a copy of the
package's sources with --no-build-isolation --no-index, and setup.py takes
the module this test suite runs against (ASHL_PREBUILT) instead of
compiling it again."""
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import ashl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREBUILT = os.path.dirname(os.path.abspath(ashl.__file__))


def _missing():
    # setuptools 70.1 and later build wheels themselves (the torch 2.x venv's);
    # Debian's 66 needs the wheel package.
    # (read from its metadata: importing setuptools here would replace distutils).
    needed = ["pip", "setuptools"]
    try:
        setuptools_version = tuple(int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        setuptools_version = (0, 0)
    if setuptools_version < (70, 1):
        needed.append("wheel")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return f"{sys.executable} has no {', '.join(missing)} (python3-pip python3-setuptools python3-wheel)"
    if not os.access(os.path.join(PREBUILT, "bin", "ashl-run"), os.X_OK):
        return f"{PREBUILT}/bin/ashl-run: not built (the ashl_python target copies it there)"
    return None


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("install")
    src, target = tmp / "src", tmp / "target"
    (src / "python" / "ashl").mkdir(parents=True)
    (src / "python" / "backend").mkdir()
    (src / "docs").mkdir()
    for f in ("pyproject.toml", "setup.py", "python/backend/ashl_backend.py"):
        shutil.copy2(os.path.join(ROOT, f), src / f)
    shutil.copy2(os.path.join(ROOT, "docs", "torch.md"), src / "docs" / "torch.md")
    for f in os.listdir(os.path.join(ROOT, "python", "ashl")):
        if f.endswith(".py"):
            shutil.copy2(os.path.join(ROOT, "python", "ashl", f), src / "python" / "ashl" / f)
    env = dict(os.environ, ASHL_PREBUILT=PREBUILT, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--target", str(target), str(src)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _env(target, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("ASHL_RUN", "ASHL_TOKEN", "ASHL_TRACE")}
    env.update(PYTHONPATH=str(target), PATH=f"{target / 'bin'}{os.pathsep}/usr/bin:/bin", **extra)
    return env


def test_pip_install_puts_the_console_script_next_to_the_native_launcher(installed):
    script = installed / "bin" / "ashl-run"
    native = installed / "ashl" / "bin" / "ashl-run"
    assert os.access(script, os.X_OK) and os.access(native, os.X_OK)
    head = script.read_bytes()[:4096]
    assert head.startswith(b"#!") and b"ashl.run" in head and b"main" in head  # pip's wrapper of ashl.run:main
    assert not native.read_bytes().startswith(b"#!")                            # the executable of tools/ashl-run
    done = subprocess.run([str(script), "--help"], env=_env(installed), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ashl-run")
    for flag in ("--servers", "--workers", "--trace", "--insecure"):
        assert flag in done.stdout
    assert "--token" not in done.stdout


def test_console_script_refuses_a_token_on_the_command_line(installed):
    done = subprocess.run([str(installed / "bin" / "ashl-run"), "--token", "s3cret", "--", "true"],
                          env=_env(installed), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "ASHL_TOKEN" in done.stderr


def test_console_script_runs_a_job_with_the_token_in_the_environment_only(installed, tmp_path):
    out = tmp_path / "seen"
    out.mkdir()
    # Each process writes what it saw: the package it imported, its role, the
    # token in its environment, and whether the token is on its launcher's
    # command line (the native ashl-run, its parent).
    prog = ("import os, sys, ashl; j = ashl.job(); "
            "parent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read(); "
            f"open(os.path.join({str(out)!r}, f'{{j.role}}{{j.rank}}'), 'w').write("
            "f'{ashl.__file__}|{j.role}|{j.token}|{j.token.encode() in parent}')")  # the token is not in prog either
    done = subprocess.run([str(installed / "bin" / "ashl-run"), "-s", "1", "-w", "2", "--timeout", "60", "--",
                           sys.executable, "-c", prog],
                          env=_env(installed, ASHL_TOKEN="s3cret-s3cret-s3cret"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {f: (out / f).read_text().split("|") for f in sorted(os.listdir(out))}
    assert sorted(seen) == ["server0", "worker0", "worker1"]
    for path, role, token, on_cmdline in seen.values():
        assert path.startswith(str(installed))  # the installed package, not the build tree
        assert token == "s3cret-s3cret-s3cret"
        assert on_cmdline == "False"


def test_console_script_does_not_start_itself_without_the_native_launcher(installed, tmp_path):
    # A copy of the package without its native ashl-run: the only ashl-run on
    # PATH is the console script, which must say so instead of recursing.
    copy = tmp_path / "t"
    shutil.copytree(installed, copy, symlinks=True)
    os.remove(copy / "ashl" / "bin" / "ashl-run")
    done = subprocess.run([str(copy / "bin" / "ashl-run"), "--insecure", "--", "true"], env=_env(copy),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "the native one is not in this package" in done.stderr
