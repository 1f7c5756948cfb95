"""The launcher belongs to the MPI that mpi4py is built on (deepfusion.parallel.runtime.find_mpiexec): a launcher
of another MPI (the mpich wheel's beside a site Open MPI's mpi4py, or the reverse) is passed over, and where no
matching one is in reach the job command says so in one line."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from helpers import ROOT, run_cli
from deepfusion.parallel import runtime


def _fake_launcher(folder, banner: str):
    """An executable `mpiexec` in ``folder`` whose --version prints ``banner``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fresh_caches():
    runtime.mpi4py_vendor.cache_clear()
    runtime.launcher_vendor.cache_clear()
    yield
    runtime.mpi4py_vendor.cache_clear()
    runtime.launcher_vendor.cache_clear()


@pytest.mark.parametrize("banner, vendor", [
    ("HYDRA build details:\n    Version: 4.2.0", "MPICH"),
    ("mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/", "Open MPI"),
    ("mpiexec (Open MPI) 5.0.3", "Open MPI"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Hydra", "Intel MPI"),
    ("some launcher 1.0", None),
])
def test_a_launchers_mpi_is_read_off_its_version(tmp_path, fresh_caches, banner, vendor):
    assert runtime.launcher_vendor(str(_fake_launcher(tmp_path, banner))) == vendor


def test_a_launcher_of_another_mpi_first_on_path_is_passed_over(tmp_path, monkeypatch, fresh_caches):
    # This interpreter's mpi4py names its MPI (in a child process, MPI left uninitialised); an Open MPI launcher
    # first on PATH beside an MPICH mpi4py (or the reverse) is skipped for the matching one further on.
    vendor = runtime.mpi4py_vendor()
    if vendor is None:
        pytest.skip("no mpi4py here")
    other = "mpiexec (OpenRTE) 4.1.6" if vendor != "Open MPI" else "HYDRA build details:"
    matching = {"Open MPI": "mpiexec (Open MPI) 4.1.6", "Intel MPI": "Intel(R) MPI Library"}.get(vendor, "HYDRA build details:")
    wrong, right = _fake_launcher(tmp_path / "a", other), _fake_launcher(tmp_path / "b", matching)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))  # nothing beside "this interpreter"
    monkeypatch.setenv("PATH", f"{wrong.parent}{os.pathsep}{right.parent}")
    assert runtime.find_mpiexec() == str(right) and runtime.mpiexec_mismatch() is None
    monkeypatch.setenv("PATH", str(wrong.parent))  # only the other MPI's launcher: none, and one line on why
    assert runtime.find_mpiexec() is None
    why = runtime.mpiexec_mismatch()
    assert why.startswith(f"mpi4py is built on {vendor}, and no mpiexec in reach is {vendor}'s: {wrong} (") and "\n" not in why


def test_the_local_job_refuses_a_launcher_of_another_mpi_in_one_line(tmp_path, monkeypatch, fresh_caches):
    # The rendered local job names the launcher; with only another MPI's in reach it is refused, nothing printed.
    vendor = runtime.mpi4py_vendor()
    if vendor is None:
        pytest.skip("no mpi4py here")
    fake = _fake_launcher(tmp_path / "bin", "mpiexec (OpenRTE) 4.1.6" if vendor != "Open MPI" else "HYDRA build details:")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}/usr/bin:/bin")
    proc = run_cli("jobs", "local", str(ROOT / "configs" / "burgers.toml"), "--ranks-per-node", "2", "--threads", "1")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"mpi4py is built on {vendor}, and no mpiexec in reach is" in proc.stderr
