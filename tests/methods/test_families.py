"""The family protocol and registry: no family named in the engine, the built-in families declare what
they provide, a family built and tried on one instance at configuration (deepfusion/configuration/family_checks.py),
and the tutorial's family (docs/families.md, run as written) trains, infers and evaluates."""

from __future__ import annotations

import ast
import dataclasses
import h5py
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ROOT, float32_atol, run_cli
from deepfusion.configuration.registry import builtin_families, family_class, known_families
from deepfusion.parallel.runtime import find_mpiexec

# Members each declared capability promises (docs/families.md).
MEMBERS = {
    "reference": ("reference", "reference_name", "truth", "truth_name"),
    "floor": ("discrete_optimum", "floor_name"),
    "classical": ("classical_methods", "classical_baseline", "classical_configurations", "classical_solver",
                  "classical_to_grid"),
    "polish": ("polish", "polish_step"),
    "input_fields": ("input_fields",),
    "precondition": ("hessian", "at_resolution"),
    "domain": ("domain",),
    "derived": ("derived",),
    "quantities": ("quantities",),
    "differentiable": (),  # a promise about inputs, field and loss_terms: no member of its own
}


def _strings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def test_the_engine_names_no_family_outside_the_registry():
    names = set(builtin_families())
    found = []
    for path in sorted((ROOT / "deepfusion").rglob("*.py")):
        if path.name == "registry.py":
            continue
        text = path.read_text()
        tree = ast.parse(text)
        found += [f"{path.name}:{node.lineno}: {node.value!r}" for node in _strings(tree) if node.value in names]
        # Capabilities are declared, not probed.
        found += [f"{path.name}: hasattr probe" for _ in re.finditer(r"hasattr\(problem", text)]
    assert not found, found


@pytest.mark.parametrize("name", sorted(builtin_families()))
def test_builtin_families_keep_the_protocol(name):
    from diffnet.protocol.family import CAPABILITIES, Family

    cls = family_class(name)
    assert issubclass(cls, Family) and cls.name == name and name in known_families()
    grid = (9,) * cls.dims
    problem = cls.from_options(cls.Options(), grid)
    assert problem.capabilities <= set(CAPABILITIES)
    for capability in problem.capabilities:
        for member in MEMBERS[capability]:
            assert hasattr(problem, member), (name, capability, member)
    for f in dataclasses.fields(cls.Options):
        assert f.metadata["doc"].strip(), f"{name}.{f.name} has no meaning"
    spec = problem.parameters
    params = problem.sample(4, "random", 0)
    assert params.shape == (4, *spec.shape) and ((params >= spec.low) & (params <= spec.high)).all()
    x = problem.inputs(torch.as_tensor(params))
    assert x.shape == (4, cls.in_channels, *grid)
    channels = len(cls.unknowns)  # one network output channel per unknown; one unknown's field has no channel axis
    u = problem.field(torch.zeros(4, channels, *grid, dtype=torch.float64), torch.as_tensor(params))
    assert set(problem.loss_terms(u, torch.as_tensor(params))) and u.shape == (4, *([channels] if channels > 1 else []), *grid)
    assert problem.at_resolution((5,) * cls.dims).resolution == (5,) * cls.dims
    if problem.has("precondition"):  # the family's Hessian is what its loss says
        from diffnet.multigrid.hessian import probe_stencil

        p = torch.as_tensor(params)
        v = problem.field(0.01 * torch.randn(4, channels, *grid, dtype=torch.float64), p)  # no element near inverting
        stencil, probed = problem.hessian(v, p), probe_stencil(problem, v, p)
        blocks = (channels, channels) if channels > 1 else ()  # several unknowns: a block stencil
        assert stencil.shape == (4, *blocks, 3**cls.dims, *grid)
        # The probes are central differences: exact for a quadratic loss, O(step^2) for a nonlinear one (whose
        # Hessian tests/methods/test_hyperelasticity.py checks against autograd's exact products).
        tol = 1e-4 if name.startswith("hyperelasticity") else 1e-9
        assert torch.allclose(stencil, probed, rtol=0, atol=tol * probed.abs().max())


def _tutorial(tmp_path):
    """The tutorial's module and config, written from docs/families.md as they stand."""
    text = (ROOT / "docs" / "families.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)
    toml = re.findall(r"```toml\n(\[problem\].*?)```", text, re.S)
    assert code and toml  # the tutorial's module and config come first (later blocks: other sections)
    (tmp_path / "screened_poisson.py").write_text(code[0])
    (tmp_path / "screened.toml").write_text(toml[0])
    return tmp_path / "screened.toml"


def test_every_capability_is_declared_once_on_its_protocol_and_listed_alike_everywhere():
    # The protocols (diffnet.protocol.capabilities.PROTOCOLS) are the one declaration: the table in diffnet.protocol.family's
    # docstring and the one in docs/families.md list exactly them, and `require` describes each from its protocol
    # (it once kept its own mapping, which lacked 'precondition' and 'domain': a KeyError instead of a line).
    from diffnet.protocol import family as family_module
    from diffnet.protocol.capabilities import PROTOCOLS, describe
    from deepfusion.configuration.inputs import InputError, require

    in_docstring = re.findall(r"^``(\w+)``", family_module.__doc__, re.M)
    in_docs = re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "families.md").read_text().split("| capability |", 1)[1]
                         .split("\n\n", 1)[0], re.M)
    assert in_docstring == in_docs == list(PROTOCOLS)
    bare = family_class("burgers").from_options(family_class("burgers").Options(), (9, 9))
    for capability in PROTOCOLS:
        assert describe(capability) and "\n" not in describe(capability)
        if not bare.has(capability):
            with pytest.raises(InputError, match=f"does not declare the '{capability}' capability"):
                require(bare, capability, "a command")


def test_tutorial_energy_is_minimised_by_its_fem_solution(tmp_path, monkeypatch):
    _tutorial(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from screened_poisson import ScreenedPoisson

    problem = ScreenedPoisson((17, 17))
    k = np.array([1.5, 8.0])
    u = torch.tensor(problem.reference(k), requires_grad=True)
    (grad,) = torch.autograd.grad(problem.loss_terms(u, torch.as_tensor(k))["energy"].sum(), u)
    # The interior gradient of the discrete energy vanishes at the Q1 solution (to rounding).
    assert grad[:, 1:-1, 1:-1].abs().max() < 1e-12
    truth = problem.truth(k)
    floor = np.linalg.norm(u.detach().numpy() - truth) / np.linalg.norm(truth)
    assert 1e-4 < floor < 5e-2  # a real discretisation error, below the field's size


@pytest.mark.timeout(600)
def test_tutorial_family_trains_infers_and_evaluates(tmp_path):
    config = _tutorial(tmp_path)
    run_dir = tmp_path / "run"
    quick = ["--set", "multigrid.epochs=[6,3]", "--set", "data.n_train=16", "--set", "data.n_test=3",
             "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]
    proc = run_cli("train", str(config), "--out", str(run_dir), *quick, path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["floor_field"] == "the Q1 FEM on this grid" and len(report["k"]) == 3
    assert 0 < report["mean_floor"] < report["mean_rel_l2"] < 1 and report["ratio_to_floor"] > 1
    out = tmp_path / "k.h5"
    proc = run_cli("infer", str(run_dir), "--param", "k=2.5", "--param", "k=7.0", "--out", str(out), path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    import h5py

    with h5py.File(out) as f:
        assert f["u"].shape == (2, 33, 33) and list(f["k"][()]) == [2.5, 7.0]
        assert f.attrs["problem"] == "screened_poisson" and list(f.attrs["screened_poisson.k_range"]) == [1.0, 10.0]
    # An unknown name, and --c (Burgers' name, not this family's), are one line naming the family's.
    proc = run_cli("infer", str(run_dir), "--param", "q=2.5", "--out", str(out), path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "deepfusion: error: q: this run's family (screened_poisson) takes its instances as k"
    proc = run_cli("infer", str(run_dir), "--c", "3", "--out", str(out), path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.strip() == ("deepfusion: error: --c: not a name of this run's family "
                                                           "(screened_poisson), which takes its instances as k "
                                                           "(--param NAME=VALUE)")
    # A capability the family does not declare: one line, status 2.
    proc = run_cli("compare", str(run_dir), "--out", str(tmp_path / "c.json"), path=[tmp_path])
    assert proc.returncode == 2 and "does not declare the 'classical' capability" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("infer", str(run_dir), "--param", "k=2.5", "--polish", "1", "--out", str(out), path=[tmp_path])
    assert proc.returncode == 2 and "does not declare the 'polish' capability" in proc.stderr


def test_an_unknown_family_is_one_line_listing_the_known_ones():
    from deepfusion.configuration.schema import ConfigError
    from deepfusion.configuration.config import load_config

    with pytest.raises(ConfigError) as exc:
        load_config(None, ["problem.family=heat"])
    message = str(exc.value)
    assert "\n" not in message and message.startswith("problem.family: unknown family 'heat' (known: ")
    assert all(name in message for name in known_families()) and "'package.module:Class'" in message


def _strict(tmp_path) -> None:
    """The tutorial's family with docs/families.md's check_instances (as written): k above 9 is not an instance."""
    text = (ROOT / "docs" / "families.md").read_text()
    method = re.search(r"```python\n(.*?)```", text[text.index("## Instances that are not instances"):], re.S).group(1)
    (tmp_path / "strict.py").write_text("import numpy as np\n\nfrom screened_poisson import ScreenedPoisson\n\n\n"
                                        "class Strict(ScreenedPoisson):\n" + method)


@pytest.mark.timeout(600)
def test_an_instance_the_family_finds_invalid_is_refused_in_one_line_everywhere(tmp_path):
    # (and the Python API takes instances under the family's own name)
    config = _tutorial(tmp_path)
    _strict(tmp_path)
    quick = ["--set", 'problem.family="strict:Strict"', "--set", "multigrid.levels=[]", "--set", "problem.resolution=[17,17]",
             "--set", "train.epochs=1", "--set", "data.n_train=16", "--set", "data.n_test=2",
             "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]
    # Training: the Sobol set over k in [1, 10] holds instances past 9; nothing is written.
    proc = run_cli("train", str(config), "--out", str(tmp_path / "bad"), *quick, path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert re.search(r"data: the training set's instance \d+: k = 9\.\d+ is beyond this family's model", proc.stderr)
    assert not (tmp_path / "bad").exists()
    run_dir = tmp_path / "run"
    proc = run_cli("train", str(config), "--out", str(run_dir), *quick, "--set", "screened_poisson.k_range=[1.0,8.0]",
                   path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    # Inference, the CLI and the Python API: the index of the first invalid instance, status 2.
    proc = run_cli("infer", str(run_dir), "--param", "k=2.5", "--param", "k=9.5", "--out", str(tmp_path / "k.h5"),
                   path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "deepfusion: error: --param k: instance 1: k = 9.5 is beyond this family's model (k <= 9)"
    assert not (tmp_path / "k.h5").exists()
    sys.path.insert(0, str(tmp_path))
    try:
        from deepfusion import Surrogate
        from deepfusion.configuration.inputs import InputError

        surrogate = Surrogate.load(run_dir)
        with pytest.raises(InputError, match=r"^c: this run's family \(screened_poisson\) takes its instances as k$"):
            surrogate(c=[9.5])  # Burgers' name, not this family's
        # Under the family's own name, or positionally, and the messages use the name.
        assert np.array_equal(surrogate(k=[2.5, 7.0]), surrogate([2.5, 7.0]))
        with pytest.raises(InputError, match=r"^k: instance 0: k = 9.5 is beyond"):
            surrogate(k=[9.5])
        with pytest.raises(InputError, match=r"^q: this run's family \(screened_poisson\) takes its instances as k$"):
            surrogate(q=[2.5])
        # The default check beneath the family's own: every entry finite (and > 0 for a positive k).
        with pytest.raises(ValueError, match=r"^instance 0: k = nan; every entry must be finite and > 0$"):
            Surrogate.load(run_dir).family.check_instances(np.array([np.nan]))
    finally:
        sys.path.remove(str(tmp_path))


def _section_code(heading: str) -> str:
    text = (ROOT / "docs" / "families.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)


def _write_section(tmp_path, heading: str, end: str, module: str, config: str) -> str:
    """docs/families.md's section from ``heading`` to ``end``: its first python block written to ``module``, its first
    toml block to ``config`` (both in ``tmp_path``), as the page has them; the section's text."""
    text = (ROOT / "docs" / "families.md").read_text()
    section = text[text.index(heading):text.index(end)]
    (tmp_path / module).write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    (tmp_path / config).write_text(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    return section


@pytest.mark.timeout(600)
def test_the_classical_example_is_swept_by_compare_as_written(tmp_path):
    config = _tutorial(tmp_path)
    (tmp_path / "screened_compared.py").write_text(_section_code("## Classical solvers: the `classical` capability"))
    run_dir = tmp_path / "run"
    quick = ["--set", 'problem.family="screened_compared:ScreenedCompared"', "--set", "multigrid.levels=[]",
             "--set", "problem.resolution=[17,17]", "--set", "train.epochs=2", "--set", "data.n_train=16",
             "--set", "data.n_test=2", "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]
    proc = run_cli("train", str(config), "--out", str(run_dir), *quick, path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "cmp.json"
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--out", str(out), path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["methods"] == {"q1-direct": "Q1 FEM, sparse direct solve (scipy spsolve)"}
    assert {p["method"] for p in report["search"]} == {"q1-direct"} and [p["grid"] for p in report["search"]][0] == 5
    row = report["rows"][0]
    # A two-epoch network is far off; the direct solve on some grid of the search reaches its error.
    assert row["classical_method"] == "q1-direct" and row["classical_error"] <= row["diffnet_error"]
    assert row["pyamg_default"] is None and "the family's baseline" not in proc.stdout


def _broken(tmp_path, body: str):
    """A family of the classical example with ``body`` replacing members; its module imported from tmp_path."""
    (tmp_path / "screened_compared.py").write_text(_section_code("## Classical solvers: the `classical` capability"))
    (tmp_path / "broken.py").write_text("import numpy as np\n\nfrom screened_compared import ScreenedCompared\n\n\n"
                                        "class Broken(ScreenedCompared):\n" + body)
    return tmp_path


@pytest.mark.parametrize("body, message", [
    ('    classical_methods = ["q1-direct"]\n',
     "screened_poisson: classical_methods must be a non-empty mapping method -> description (str -> str), got ['q1-direct']"),
    ("    def classical_configurations(self):\n        return [5, 9, 17]\n",
     "screened_poisson: classical_configurations() must return a non-empty mapping method -> grids, got list"),
    ('    def classical_configurations(self):\n        return {"q1-direct": 17}\n',
     "screened_poisson: classical_configurations()['q1-direct'] must be a non-empty list of int grids, got 17"),
    ('    classical_baseline = "sa-cg"\n',
     "screened_poisson: classical_baseline must be None or one of classical_methods (q1-direct), got 'sa-cg'"),
    ("    def classical_solver(self, grid):\n        return None\n",
     "screened_poisson.classical_solver(grid) does not take the arguments of classical_solver(method, grid) "
     "(capability 'classical')"),
    ("    classical_to_grid = None\n",
     "screened_poisson declares 'classical' and has no classical_to_grid: expected a method "
     "classical_to_grid(method, native, instances)"),
    ('    capabilities = frozenset({"reference", "floor", "classical", "polish"})\n',
     "screened_poisson declares 'polish' and has no polish: expected a method polish(instances, fields, k)"),
    ('    capabilities = frozenset({"reference", "classical", "solve"})\n',
     "screened_poisson declares the unknown capability 'solve' (known: reference, floor, classical, polish, "
     "input_fields, precondition, least_squares, domain, derived, quantities, differentiable)"),
])
def test_a_capability_member_of_the_wrong_kind_is_one_line_naming_it(tmp_path, monkeypatch, body, message):
    _tutorial(tmp_path)
    _broken(tmp_path, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("broken", "screened_compared", "screened_poisson"):
        sys.modules.pop(module, None)
    from deepfusion.configuration.schema import ConfigError
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    with pytest.raises(ConfigError) as exc:
        Run.from_config(load_config(tmp_path / "screened.toml", ['problem.family="broken:Broken"']))
    assert str(exc.value) == f"problem.family: {message}"


def test_a_wrong_kind_member_stops_the_cli_before_anything_is_written(tmp_path):
    config = _tutorial(tmp_path)
    _broken(tmp_path, '    classical_methods = ["q1-direct"]\n')
    proc = run_cli("train", str(config), "--set", 'problem.family="broken:Broken"', "--out", str(tmp_path / "r"),
                   path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "problem.family: screened_poisson: classical_methods must be a non-empty mapping" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("method", ["direct", "amg"])
def test_the_public_q1_system_minimises_the_public_energy_with_variable_coefficients(method):
    # docs/families.md: a user's reference from diffnet.dirichlet_system is the exact minimiser of
    # reaction_diffusion_energy for nodal nu and f (bilinear at the same Gauss points), any boundary values.
    from diffnet import dirichlet_system, reaction_diffusion_energy

    ny, nx = 17, 21
    y, x = np.meshgrid(np.linspace(0, 1, ny), np.linspace(0, 1, nx), indexing="ij")
    nu = 1 + 0.5 * np.sin(np.pi * x) * np.sin(np.pi * y)
    f = 1 + 2 * x
    fixed = np.zeros((ny, nx), dtype=bool)
    fixed[:, 0] = fixed[0, :] = True  # the other sides carry zero flux
    values = np.where(fixed, y, 0.0)
    u = dirichlet_system(nu, fixed, values, kappa=1.5, f=f).solve(method, tol=1e-13)
    assert np.array_equal(u[fixed], values[fixed])
    t = torch.tensor(u[None], requires_grad=True)
    energy = reaction_diffusion_energy(t, torch.tensor(nu[None]), 1.5, torch.tensor(f[None]), 1 / (nx - 1), 1 / (ny - 1))
    (grad,) = torch.autograd.grad(energy.sum(), t)
    scale = float(np.abs(f).max()) / ((nx - 1) * (ny - 1))  # a node's load, about f h^2
    assert float(grad[0][~torch.from_numpy(fixed)].abs().max()) < 1e-9 * scale


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_two_entry_family_from_the_docs_trains_infers_and_compares_by_its_names(tmp_path):
    import h5py
    import shlex
    import subprocess

    from helpers import child_env

    section = _write_section(tmp_path, "## A second complete family: two parameters, variable coefficients",
                             "## Installing a family as a package", "heat_source.py", "heat.toml")
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    small = " ".join(shlex.quote(a) for a in ["--set", "problem.resolution=[17,17]", "--set", "data.n_train=32",
                                              "--set", "train.epochs=3", "--set", "data.n_test=2",
                                              "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"])
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for command in commands:
        command = command.replace("mpiexec", shlex.quote(find_mpiexec())).replace(" --out runs/heat", f" {small} --out runs/heat")
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    rows = np.load(tmp_path / "p.npy")
    with h5py.File(tmp_path / "p.h5") as f:
        assert np.array_equal(f["p"][()], rows) and f["u"].shape == (2, 17, 17)
        fields = f["u"][()]
    assert (tmp_path / "uq.h5").is_file()
    report = json.loads((tmp_path / "compare.json").read_text())
    assert report["methods"] == {"q1-amg": "Q1 FEM, pyamg smoothed aggregation + CG"} and report["rows"]
    # Every entry its own range and name; an invalid instance refused by index; the Python API by name.
    run_dir = tmp_path / "runs" / "heat"
    np.save(tmp_path / "out.npy", np.array([[0.5, 1.0], [1.5, 1.0]]))
    proc = run_cli("infer", str(run_dir), "--param", f"p={tmp_path / 'out.npy'}", "--out", str(tmp_path / "o.h5"),
                   path=[tmp_path])
    assert proc.returncode == 0 and proc.stderr.strip() == (
        f"deepfusion: warning: {tmp_path / 'out.npy'}: 1.5 (p[0] (p1)) is outside its training range [-1, 1]; "
        "the field is an extrapolation")
    np.save(tmp_path / "bad.npy", np.array([[0.5, 1.0], [-3.0, 1.0]]))
    proc = run_cli("infer", str(run_dir), "--param", f"p={tmp_path / 'bad.npy'}", "--out", str(tmp_path / "b.h5"),
                   path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"deepfusion: error: {tmp_path / 'bad.npy'}: instance 1: p1 = -3 makes kappa <= 0 (p1 must be > -2)")
    sys.path.insert(0, str(tmp_path))
    try:
        from deepfusion import Surrogate

        surrogate = Surrogate.load(run_dir)
        low, high = surrogate.parameter_range
        assert low.tolist() == [-1.0, 0.0] and high.tolist() == [1.0, 2.0]
        # Another process and thread count: float32 rounding inside the network only (conftest).
        np.testing.assert_allclose(surrogate(p=rows), fields, rtol=0, atol=float32_atol(run_dir, np.abs(fields).max()))
    finally:
        sys.path.remove(str(tmp_path))


_PICKY = '''
from screened_poisson import ScreenedPoisson


class OddGrid(ScreenedPoisson):
    @classmethod
    def check_options(cls, options, *, n_train, sampling, resolution):
        if any(n % 2 == 0 for n in resolution):
            raise ValueError(f"k_range: this family needs an odd number of nodes a side, got {list(resolution)}")


class NoBuild(ScreenedPoisson):
    @classmethod
    def from_options(cls, options, resolution):
        raise ValueError("k_range: cannot build on this machine\\nsecond line")


class NoInputs(ScreenedPoisson):
    def inputs(self, k):
        raise ValueError("data.sampling: inputs refused")
'''


@pytest.mark.parametrize("family, message", [
    ("OddGrid", "screened_poisson.k_range: this family needs an odd number of nodes a side, got [16, 16]"),
    ("NoBuild", "screened_poisson.k_range: cannot build on this machine"),
    ("NoInputs", "data.sampling: inputs refused"),
])
def test_a_familys_value_error_while_it_is_configured_is_one_line_and_writes_nothing(tmp_path, family, message):
    # check_options receives the grid; a ValueError from it, from from_options or from inputs (one instance,
    # at configuration time) is the family's one-line refusal: status 2, no run directory.
    config = _tutorial(tmp_path)
    (tmp_path / "picky.py").write_text(_PICKY)
    proc = run_cli("train", str(config), "--out", str(tmp_path / "bad"), "--set", f'problem.family="picky:{family}"',
                   "--set", "problem.resolution=[16,16]", "--set", "multigrid.levels=[]", path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.strip() == f"deepfusion: error: {message}", proc.stderr
    assert not (tmp_path / "bad").exists()


def _cut_domain_example(tmp_path):
    """docs/families.md's complete cut-domain family and its config, written from the page as they stand."""
    _write_section(tmp_path, "## A domain cut out of the grid", "## Installing a family as a package", "heat_lplate.py",
                   "lplate.toml")
    return tmp_path / "lplate.toml"


@pytest.mark.timeout(600)
def test_the_docs_cut_domain_family_trains_infers_compares_and_runs_uq_as_written(tmp_path):
    config = _cut_domain_example(tmp_path)
    run_dir = tmp_path / "run"
    quick = ["--set", "multigrid.epochs=[2,1]", "--set", "data.n_train=16", "--set", "data.n_test=2",
             "--set", "model.channels=[8,16]", "--set", "train.batch_size=8", "--set", "parallel.threads_per_rank=1",
             "--set", "output.plots=false", "--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]"]
    proc = run_cli("train", str(config), "--out", str(run_dir), *quick, path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["truth"].startswith("body-fitted P1 FEM") and 0 < report["mean_floor"] < report["mean_rel_l2"]
    np.save(tmp_path / "holes.npy", np.array([[0.3, 0.3, 0.08], [0.25, 0.35, 0.06]]))
    proc = run_cli("infer", str(run_dir), "--param", f"hole={tmp_path / 'holes.npy'}", "--out", str(tmp_path / "hole.h5"),
                   path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "hole.h5") as f:
        u, inside = f["u"][0], f["inside"][0].astype(bool)
    assert np.all(u[~inside] == 0) and np.abs(u[inside]).max() > 0
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--polish", "1",
                   "--out", str(tmp_path / "c.json"), path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert [r["product"] for r in rows] == ["DiffNet", "DiffNet + 1 V-cycle"]
    assert rows[1]["diffnet_error"] < rows[0]["diffnet_error"]  # the polish never makes it worse
    proc = run_cli("uq", str(run_dir), "--samples", "6", "--batch", "3", "--out", str(tmp_path / "uq.h5"), path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "uq.h5") as f:
        fraction = f["inside_fraction"][()]
    # the notch in no instance, the hole's neighbourhood in some, the rest in all
    assert fraction.min() == 0 and ((fraction > 0) & (fraction < 1)).any() and fraction.max() == 1
    # The truth as the evaluation has it, from the command line.
    proc = run_cli("reference", "heat_lplate:HeatLPlate", "--param", "hole=" + str(tmp_path / "holes.npy"), "--resolution", "17",
                   "--truth", "--out", str(tmp_path / "truth.h5"), path=[tmp_path])
    assert proc.returncode == 0 and "the independent reference: body-fitted" in proc.stdout, proc.stderr


def _two_species(tmp_path):
    """docs/families.md's family with two unknowns and its config, written from the page as they stand."""
    text = (ROOT / "docs" / "families.md").read_text().split("## Several unknowns: two coupled species", 1)[1]
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    toml = re.findall(r"```toml\n(\[problem\].*?)```", text, re.S)[0]
    # One text: the page's module is the example package's.
    assert code == (ROOT / "examples" / "families" / "two_species" / "two_species.py").read_text()
    (tmp_path / "two_species.py").write_text(code)
    (tmp_path / "two.toml").write_text(toml)
    return tmp_path / "two.toml"


def test_the_two_species_family_of_the_docs_is_minimised_by_its_coupled_solution_and_trains(tmp_path, monkeypatch):
    import json

    config = _two_species(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from two_species import TwoSpecies

    family = TwoSpecies((17, 17))
    p = np.array([[1.5, 0.8], [8.0, 0.3]])
    u = torch.tensor(family.reference(p), requires_grad=True)
    (grad,) = torch.autograd.grad(family.loss_terms(u, torch.as_tensor(p))["energy"].sum(), u)
    assert u.shape == (2, 2, 17, 17) and grad[..., 1:-1, 1:-1].abs().max() < 1e-12  # the exact minimiser
    assert (u[:, 1].abs().max() > 0).all()  # the second species is driven by the coupling alone
    run_dir = tmp_path / "run"
    proc = run_cli("train", str(config), "--out", str(run_dir), "--set", "problem.resolution=[17,17]",
                   "--set", "data.n_train=16", "--set", "data.n_test=2", "--set", "train.epochs=2",
                   "--set", "model.channels=[4,8]", "--set", "parallel.threads_per_rank=1",
                   "--set", "output.plots=false", path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert set(report["fields"]) == {"u1", "u2"} and "u2" in proc.stdout


@pytest.mark.slow  # about 9 s (probed block Hessians); the inner loop keeps test_coarse's check of the plugin
def test_the_two_species_family_trains_with_the_pages_winning_setting(tmp_path):
    # The page's own line for the winning setting, through the probed 2 x 2 block Hessian (a tiny schedule).
    config = _two_species(tmp_path)
    text = (ROOT / "docs" / "families.md").read_text().split("## Several unknowns: two coupled species", 1)[1]
    sets = re.search(r"`(--set train\.loss=preconditioned --set\s+model\.coarse_correction=9 --set "
                     r"train\.second_stage_epochs=10)`", text).group(1).split()
    proc = run_cli("train", str(config), "--out", str(tmp_path / "winning"), "--set", "problem.resolution=[17,17]",
                   "--set", "data.n_train=16", "--set", "data.n_test=2", "--set", "train.epochs=2",
                   "--set", "model.channels=[4,8]", "--set", "parallel.threads_per_rank=1",
                   "--set", "output.plots=false", *sets, path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert "-> coarse correction on 9x9 (one kept solve)" in proc.stdout and "the second stage takes it to" in proc.stdout


def test_a_plugin_written_against_the_module_paths_of_before_is_told_their_moves(tmp_path):
    # tests/data/legacy: the tutorial's family as docs/families.md had it on 2026-11-26, its keys in an Options class
    # and its imports from the flat module paths (diffnet.family, diffnet.energy, ...). As written it is refused in
    # one line naming the new path, nothing written; with its imports moved it trains, infers and evaluates (its own
    # Options class kept).
    from diffnet.protocol.moved import MOVED

    legacy = ROOT / "tests" / "data" / "legacy"
    quick = ["--set", "multigrid.epochs=[4,2]", "--set", "data.n_train=16", "--set", "data.n_test=2",
             "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]
    proc = run_cli("train", str(legacy / "legacy_screened.toml"), "--out", str(tmp_path / "as_written"), *quick,
                   path=[legacy])
    assert proc.returncode == 2 and not (tmp_path / "as_written").exists()
    assert proc.stderr.strip().splitlines() == [
        "deepfusion: error: problem.family 'legacy_screened:ScreenedPoisson': cannot import 'legacy_screened' (No "
        "module named 'diffnet.energy'); diffnet.energy moved to diffnet.discretisation.energy, ELEMENT_NODES to "
        "diffnet.grid.element, element_nodes to diffnet.grid.element, gauss_basis to diffnet.grid.element; or import "
        "diffnet's top-level names (CHANGELOG.md)"]
    moved = tmp_path / "moved"
    moved.mkdir()
    text = (legacy / "legacy_screened.py").read_text()
    text = text.replace("from diffnet.energy import at_gauss_points, dirichlet_energy, gauss_basis",
                        "from diffnet.discretisation.energy import at_gauss_points, dirichlet_energy\n"
                        "from diffnet.grid.element import gauss_basis")
    for old, new in MOVED.items():
        text = text.replace(f"from {old} import", f"from {new} import")
    (moved / "legacy_screened.py").write_text(text)
    proc = run_cli("train", str(legacy / "legacy_screened.toml"), "--out", str(tmp_path / "run"), *quick, path=[moved])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert len(report["k"]) == 2 and report["ratio_to_floor"] > 1


def test_a_plugin_on_the_families_old_folder_or_class_names_is_told_the_new_ones(tmp_path, monkeypatch):
    # diffnet/problems became diffnet/families and its classes end in Family (issue 76): one line names the new ones.
    from deepfusion.configuration.registry import FamilyError

    body = "\n\nclass Mine({base}):\n    name = 'mine'\n"
    (tmp_path / "old_folder.py").write_text("from diffnet.problems.elasticity import Elasticity" + body.format(base="Elasticity"))
    (tmp_path / "old_class.py").write_text("from diffnet.families.poisson import PoissonProblem" + body.format(base="PoissonProblem"))
    (tmp_path / "new_names.py").write_text("from diffnet.families.poisson import PoissonFamily" + body.format(base="PoissonFamily"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FamilyError) as folder:
        family_class("old_folder:Mine")
    assert "diffnet.problems moved to diffnet.families" in str(folder.value)
    assert "Elasticity is now ElasticityFamily" in str(folder.value) and "\n" not in str(folder.value)
    with pytest.raises(FamilyError, match="PoissonProblem is now PoissonFamily"):
        family_class("old_class:Mine")
    assert family_class("new_names:Mine").name == "mine"


def test_each_key_of_a_family_is_declared_once_on_its_field():
    # A key is a field made with option(): Family.Options, from_options and docs/configuration.md read it there.
    from deepfusion.configuration.registry import builtin_families, family_class
    from diffnet.protocol.options import option_fields

    for name in builtin_families():
        cls = family_class(name)
        keys = option_fields(cls)
        options = cls.Options
        assert [f.name for f in dataclasses.fields(options)] == list(keys), name
        for f in dataclasses.fields(options):
            assert (f.default, f.metadata["doc"]) == (keys[f.name].default, keys[f.name].metadata["doc"]), (name, f.name)
        grid = (9,) * cls.dims
        assert cls.from_options(options(), grid) == cls(grid)  # the defaults are the fields' own
    assert family_class("burgers").from_options(family_class("burgers").Options(residual="conservative"), (9, 9)).stencil \
        == "conservative"  # key= names the key where it is not the field's
    for path in sorted((ROOT / "diffnet" / "families").glob("*.py")):
        assert not re.search(r"^class \w+Options\b", path.read_text(), re.M), path


def test_the_docs_outputs_of_the_tutorial_family_balance_its_heat(tmp_path, monkeypatch):
    # docs/families.md "Outputs an engineer reads", as written, on the tutorial's family: the heat leaving through
    # x = 1 is a quarter of what the source puts in less what the screening absorbs (u = 0 on all four sides).
    import textwrap

    _tutorial(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import screened_poisson

    text = (ROOT / "docs" / "families.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "heat_out" in b)
    head, methods = block.split("\n\n", 1)
    namespace: dict = {}
    exec(head, namespace)
    exec("class Outputs(ScreenedPoisson):\n    capabilities = ScreenedPoisson.capabilities | {'derived', 'quantities'}\n"
         + textwrap.indent(textwrap.dedent(methods), "    "), {**vars(screened_poisson), **namespace}, namespace)
    family = namespace["Outputs"].from_options(namespace["Outputs"].Options(), (33, 33))
    assert family.has("derived") and family.has("quantities")
    k = np.array([2.0, 6.0])
    u = family.reference(k)
    flux = family.derived(k, u)
    assert flux["flux_x"].shape == (2, 33, 33)
    from diffnet import at_gauss_points, gauss_basis

    values, _, _, weight = gauss_basis(1.0 / 32, 1.0 / 32)
    absorbed = k**2 * weight * at_gauss_points(torch.as_tensor(u), values).sum(dim=(1, 2, 3)).numpy()
    assert np.allclose(family.quantities(k, u)["heat_out"], (1.0 - absorbed) / 4, rtol=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_residual_family_of_the_docs_trains_with_its_correction_and_sweeps_is_evaluated_and_compared(tmp_path):
    # docs/families.md's residual family as written (a plugin: its loss a diffnet.Residual), at a smaller size: the
    # product is the Gauss-Newton correction and the sweeps on J^T J, twice; the evaluation has the floor, the
    # Gauss-Newton norm and the error against the scheme's own solution; compare races Newton with a sparse LU.
    import shlex

    section = _write_section(tmp_path, "## A residual family: advection, diffusion and a cubic reaction",
                             "## Outputs an engineer reads", "advection_reaction.py", "wind.toml")
    small = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[3,2]",
             "--set", "data.n_train=16", "--set", "data.n_test=2", "--set", "model.coarse_correction=5",
             "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]
    for line in re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines():
        args = shlex.split(line)[2:]  # after "PYTHONPATH=. deepfusion"
        if args[0] == "train":
            args += small
        proc = run_cli(*args, cwd=tmp_path, path=[tmp_path])
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if args[0] == "train":
            assert ("product: U-Net deepened by 1 level -> coarse correction on 5x5 (Gauss-Newton) -> 2 symmetric "
                    "Gauss-Seidel sweeps on J^T J, 2 times") in proc.stdout
    report = json.loads((tmp_path / "runs" / "wind" / "eval.json").read_text())
    assert report["product"]["steps"][1:] == ["coarse correction on 5x5 (Gauss-Newton)",
                                              "2 symmetric Gauss-Seidel sweeps on J^T J, 2 times"]
    assert np.isfinite(report["ratio_to_floor"]) and report["mean_floor"] > 0
    assert report["gauss_newton_norm"]["name"] == "Gauss-Newton norm" and len(report["grid_rel_l2"]) == 2
    compared = json.loads((tmp_path / "runs" / "wind" / "compare.json").read_text())
    assert compared["methods"] == {"newton-lu": "the scheme, Newton with a sparse LU (SuperLU)"} and compared["rows"]
    assert "Gauss-Newton" in compared["product"] and all(p["method"] == "newton-lu" for p in compared["search"])
