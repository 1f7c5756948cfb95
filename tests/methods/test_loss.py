"""The loss as an object (diffnet/protocol/loss.py): a family's loss is an Energy, a Residual or a plain Loss; what may
finish the network's field follows from its kind; what it declares is checked against the loss itself before training
(an energy's Hessian stencil against autograd's Hessian-vector product), one line, status 2, nothing written; the
configuration asks the loss's kind (deepfusion/configuration/family_checks.py)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from helpers import ROOT, run_cli
from deepfusion.analysis.selfcheck import FamilyMismatch, check_family
from deepfusion.configuration.config import load_config
from deepfusion.configuration.run import Run
from deepfusion.configuration.schema import ConfigError
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.multigrid.hessian import STENCIL_TOLERANCE, stencil_mismatch
from diffnet.protocol.loss import Energy, Loss, Residual, refusal

# A 5-point residual's squares: -lap u + k u = 1, u = 0 on the boundary. Its Hessian J^T J couples nodes two apart,
# not a 3^d stencil: declared an energy (as an object, or by the earlier capability), it is refused before training.
SQUARED = textwrap.dedent('''
    from dataclasses import dataclass

    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla
    import torch
    import torch.nn.functional as F

    from diffnet import Energy, Family, ParameterSpec, Residual


    def solve(k, n):
        h, m = 1.0 / (n - 1), n - 2
        second = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], (m, m)) / h**2
        a = -(sp.kron(sp.identity(m), second) + sp.kron(second, sp.identity(m))) + k * sp.identity(m * m)
        return np.pad(spla.spsolve(a.tocsc(), np.ones(m * m)).reshape(m, m), 1)


    @dataclass(frozen=True)
    class Squared(Family):
        resolution: tuple

        name = "squared"
        in_channels = 1
        capabilities = frozenset({"reference", "floor"})

        @property
        def parameters(self):
            return ParameterSpec("k", (), 1.0, 2.0)

        def coordinates(self):
            return {"y": np.linspace(0, 1, self.resolution[0]), "x": np.linspace(0, 1, self.resolution[1])}

        def inputs(self, k):
            return k[:, None, None, None].expand(-1, 1, *self.resolution)

        def field(self, raw, k):
            return F.pad(raw[:, 0, 1:-1, 1:-1], (1, 1, 1, 1))

        def residual(self, u, k):
            h = 1.0 / (self.resolution[0] - 1)
            c = u[:, 1:-1, 1:-1]
            lap = (u[:, 2:, 1:-1] + u[:, :-2, 1:-1] + u[:, 1:-1, 2:] + u[:, 1:-1, :-2] - 4 * c) / h**2
            return F.pad(-lap + k.to(u.dtype)[:, None, None] * c - 1.0, (1, 1, 1, 1)) * h

        def loss_terms(self, u, k):
            return {"residual": self.residual(u, k).square().sum(dim=(1, 2))}

        def loss(self):
            return Energy(self.loss_terms)  # wrong: a residual's squares

        def reference(self, k, progress=None):
            return np.stack([solve(float(v), self.resolution[0]) for v in k])

        def reference_name(self):
            return "the scheme"

        def discrete_optimum(self, k, initial=None):
            return self.reference(k), np.ones(len(k), dtype=bool)

        def floor_name(self):
            return "the scheme"


    @dataclass(frozen=True)
    class Declared(Squared):
        capabilities = frozenset({"reference", "floor", "precondition"})  # the earlier way to say "an energy"

        def loss(self):
            return Family.loss(self)


    @dataclass(frozen=True)
    class Right(Squared):
        def loss(self):
            return Residual(self.loss_terms, self.residual)
''')


@pytest.fixture(scope="module")
def squared(tmp_path_factory):
    import importlib
    import sys

    folder = tmp_path_factory.mktemp("squared")
    (folder / "squared_family.py").write_text(SQUARED)
    sys.path.insert(0, str(folder))
    try:
        yield folder, importlib.import_module("squared_family")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("squared_family", None)


def test_a_familys_loss_is_read_off_its_earlier_declarations_and_admits_by_its_kind(squared):
    _, module = squared
    assert isinstance(module.Declared((9, 9)).loss(), Energy)  # capability 'precondition'
    assert isinstance(module.Right((9, 9)).loss(), Residual) and type(module.Squared((9, 9)).loss()) is Energy
    assert PoissonFamily((9, 9)).loss().hessian.__func__ is PoissonFamily.hessian
    conservative, central = BurgersFamily((9, 9), stencil="conservative"), BurgersFamily((9, 9))
    assert conservative.loss().kind == "residual" and type(central.loss()) is Loss
    assert refusal(conservative.loss(), "sweeps") is None and refusal(conservative.loss(), "coarse_correction") is None
    assert refusal(conservative.loss(), "preconditioned") == (
        "its loss is a residual's squares (diffnet.Residual), and the preconditioned loss needs an energy "
        "(diffnet.Energy: V-cycles of its Hessian, a 3^d-point stencil)")
    assert refusal(central.loss(), "sweeps").startswith("its loss is a loss of no declared kind")
    with pytest.raises(TypeError, match="needs a residual"):
        Residual(central.loss_terms)


def test_the_configuration_asks_the_losss_kind_and_refuses_in_one_line():
    burgers = ROOT / "configs" / "burgers.toml"
    for overrides, message in (
            (["burgers.residual=sobel", "model.coarse_correction=5"],
             "model.coarse_correction: the burgers family (as configured): its loss is a loss of no declared kind"),
            (["model.coarse_correction=5", "model.sweeps=2", "train.loss=preconditioned"],
             "train.loss: the burgers family (as configured): its loss is a residual's squares (diffnet.Residual), "
             "and the preconditioned loss needs an energy")):
        with pytest.raises(ConfigError) as exc:
            Run.from_config(load_config(burgers, ["problem.resolution=[17,17]", "multigrid.levels=[]", *overrides]))
        assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    # A residual takes the coarse correction and sweeps (on J^T J) and cycles.
    run = Run.from_config(load_config(burgers, ["problem.resolution=[17,17]", "multigrid.levels=[]",
                                                "model.coarse_correction=5", "model.sweeps=2", "model.cycles=2"]))
    assert run.product(run.build_model()).steps()[1:] == [
        "coarse correction on 5x5 (Gauss-Newton)", "2 symmetric Gauss-Seidel sweeps on J^T J, 2 times"]


def test_an_energys_stencil_is_checked_against_autograd_and_a_residuals_squares_are_refused(squared, tmp_path):
    folder, module = squared
    k = torch.tensor([1.5], dtype=torch.float64)
    assert stencil_mismatch(PoissonFamily((9, 9)), torch.as_tensor(PoissonFamily((9, 9)).sample(1, "random", 0))) \
        <= 1e-12
    assert stencil_mismatch(module.Squared((9, 9)), k) > 0.01 > 1e3 * STENCIL_TOLERANCE
    for wrong in (module.Squared((9, 9)), module.Declared((9, 9))):
        with pytest.raises(FamilyMismatch, match=r"differs from autograd's Hessian-vector product by 0\.\d+ .* is a "
                                                 r"diffnet\.Residual") as exc:
            check_family(wrong, np.array([1.5]))
        assert "\n" not in str(exc.value)
    assert "residual" in check_family(module.Right((9, 9)), np.array([1.5])).members
    # Through the command line, before training: one line, status 2, nothing written.
    (folder / "squared.toml").write_text('[problem]\nfamily = "squared_family:Squared"\nresolution = [9, 9]\n'
                                         '[data]\nn_train = 4\nsampling = "random"\n[train]\nbatch_size = 2\n'
                                         '[model]\nchannels = [4, 8]\ncoarse_correction = 3\n')
    proc = run_cli("train", str(folder / "squared.toml"), "--out", str(tmp_path / "run"), path=[folder])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and not (tmp_path / "run").exists()
    assert "the squared family's loss is an energy" in proc.stderr
