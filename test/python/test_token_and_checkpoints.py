"""Issue 24, items 9 and 10 from Python: ashl.job() takes the token out of the
environment children inherit (and still has it on a second call); a Server's
checkpoint directory is locked per shard; a failed final checkpoint raises
from run(), naming the file."""
import os
import subprocess
import sys

import pytest

import ashl


def _contract(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "ASHL_INSECURE", "ASHL_NUM_SERVERS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("ASHL_ROLE", "worker")
    monkeypatch.setenv("ASHL_RANK", "0")
    monkeypatch.setenv("ASHL_NUM_WORKERS", "1")
    monkeypatch.setenv("ASHL_SERVER_ADDR", "127.0.0.1:5000")


def test_job_removes_the_token_from_the_environment_children_inherit(monkeypatch):
    _contract(monkeypatch)
    token = "0123456789abcdef-python-token"
    monkeypatch.setenv("ASHL_TOKEN", token)
    j = ashl.job()
    assert j.token == token
    assert "ASHL_TOKEN" not in os.environ
    seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('ASHL_TOKEN', 'unset'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert seen == "unset"
    seen = subprocess.run("echo ${ASHL_TOKEN-unset}", shell=True, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert seen == "unset"
    assert ashl.job().token == token  # a second call of this process still has it
    assert "ASHL_TOKEN" not in os.environ


def test_job_refuses_a_short_token_and_a_token_flag(monkeypatch):
    _contract(monkeypatch)
    monkeypatch.setenv("ASHL_TOKEN", "short")
    with pytest.raises(ValueError, match=r"^ASHL_TOKEN is 5 bytes: a token must have at least 16") as e:
        ashl.job()
    assert "short" not in str(e.value).replace("at least", "")
    monkeypatch.setenv("ASHL_TOKEN", "0123456789abcdef")
    with pytest.raises(ValueError, match=r"--token: a token on the command line is visible to every user"):
        ashl.job(["--token", "0123456789abcdef"])


def test_a_checkpoint_directory_is_locked_per_shard(tmp_path):
    fabric = ashl.InprocFabric()
    a = ashl.Server(size=8, policy="asp", workers=1, fabric=fabric, listen="s0", insecure=True,
                    checkpoint_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r'checkpoint_dir ".*" is locked by another server \(pid %d' % os.getpid()):
        ashl.Server(size=8, policy="asp", workers=1, fabric=fabric, listen="s1", insecure=True,
                    checkpoint_dir=str(tmp_path))
    # Shard 1 of a 2-server job in the same directory has its own lock.
    b = ashl.Server(size=8, policy="asp", workers=1, fabric=fabric, listen="s2", insecure=True, shard=1, servers=2,
                    checkpoint_dir=str(tmp_path))
    del a, b


def test_a_failed_final_checkpoint_raises_naming_the_file(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    fabric = ashl.InprocFabric()
    srv = ashl.Server(size=8, policy="asp", workers=1, fabric=fabric, listen="s0", insecure=True,
                      checkpoint_dir=str(ckpt), no_worker_grace=0.2)
    ckpt.rename(tmp_path / "gone")
    ckpt.write_text("a file, not a directory")  # root ignores permission bits: this fails for root too
    with pytest.raises(RuntimeError, match=r'the final checkpoint failed: checkpoint ".*ckpt/server-0\.ashlckpt".*'
                                           r'Not a directory'):
        srv.run()
    assert srv.ended == "no_worker"
    assert srv.telemetry["checkpoint_failures"] == 1
