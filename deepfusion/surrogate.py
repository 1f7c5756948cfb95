"""A trained DiffNet as a Python callable: parameters in, fields out (``deepfusion infer`` uses it too)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from deepfusion.configuration.inputs import InputError, by_name, instance_parameters, require

__all__ = ["Surrogate"]


class Surrogate:
    """A trained generator and its family: ``surrogate(c=[...])`` returns the fields.

    Use :meth:`load`. Calling it with the family's instances, under the family's own names, returns float64
    fields of shape (S, *resolution) on the run's grid: its parameter's values (``surrogate(c=[3.5, 4.0])``
    for Burgers' c, fields over (t, x); ``surrogate(a=rows)`` for the KL coefficients, (S, m)), every entry
    of a vector parameter by its name (``surrogate(hole_x=..., hole_y=..., hole_r=[0.1, 0.15], nu=0.3)``),
    or nodal fields where the family takes them (``surrogate(nu=fields)``, the diffusivity families; fields over
    (y, x)); see :func:`deepfusion.configuration.inputs.by_name`. Bad input raises
    :class:`~deepfusion.configuration.inputs.InputError` (a ``ValueError``) with the CLI's message;
    parameters outside the training range warn with
    :class:`~deepfusion.configuration.inputs.ParameterRangeWarning`.

    Attributes
    ----------
    run : Run
        The run (:class:`deepfusion.configuration.run.Run`): its config, family and held-out instances.
    product : diffnet.product.product.Product
        What the fields come from: the trained generator's field finished as the run's config says; ``product.chain()``
        states it (e.g. "U-Net -> coarse correction on 17x17 (one kept solve) -> 8 symmetric Gauss-Seidel sweeps").
    config : Config
        The run's resolved config.
    family : diffnet.protocol.family.Family
        The family on the run's grid (loss, references, floors).
    checkpoint : Path
        The checkpoint whose weights are loaded.
    device : str
        ``"cpu"`` or ``"cuda:I"``.
    chunk : int
        Instances per forward pass.

    Examples
    --------
    >>> from deepfusion import Surrogate
    >>> s = Surrogate.load("runs/burgers")              # doctest: +SKIP
    >>> u = s(c=[3.5, 4.0, 5.5])                        # (3, 64, 64) over (t, x)
    """

    def __init__(self, run, model, checkpoint: Path, device: str = "cpu", memory_mb: float = 512.0):
        from deepfusion.configuration.memory import inference_bytes_per_sample

        if not memory_mb > 0:
            raise InputError(f"memory_mb: must be > 0, got {memory_mb}")
        self.run, self.config, self.family = run, run.cfg, run.family
        self.checkpoint = Path(checkpoint)
        self.device = device
        # Built once: the trained generator (gradients in the instances only, evaluate) and what finishes its field.
        self.product = run.product(model.to(device).eval().requires_grad_(False))
        self._outputs: tuple[str, ...] | None = None  # outputs= names, read off one instance when first asked
        per_sample = inference_bytes_per_sample(run.cfg)
        self.chunk = int(max(1, min(256, memory_mb * 2**20 // per_sample)))

    @classmethod
    def load(cls, source: str | Path, *, checkpoint: str | Path | None = None, device: str = "cpu",
             threads: int | None = None, memory_mb: float = 512.0) -> "Surrogate":
        """The surrogate of a run directory (its newest valid checkpoint) or of one checkpoint file.

        Parameters
        ----------
        source : str or Path
            A run directory written by ``deepfusion train``, or a checkpoint ``.h5`` of one.
        checkpoint : str or Path, optional
            A specific checkpoint of the run directory.
        device : {"cpu", "cuda", "cuda:I"}
            Where the forward passes run.
        threads : int, optional
            torch's intra-op threads (for the whole process); default: leave as is.
        memory_mb : float
            Activation memory one forward pass may use; sets :attr:`chunk`.
        """
        from deepfusion.training.rundir import trained_model

        if threads is not None:
            if not (isinstance(threads, int) and 1 <= threads <= 4096):
                raise InputError(f"threads: must be an integer in 1..4096, got {threads!r}")
            from deepfusion.parallel.runtime import apply_threads

            apply_threads(threads)
        device = _device(device)
        source = Path(source)
        if not source.exists():
            raise InputError(f"{source}: no such run directory or checkpoint")
        # A damaged newest checkpoint is skipped for the previous one, with a warning naming it.
        run, model, path = trained_model(source, checkpoint,
                                         lambda line: warnings.warn(line, RuntimeWarning, stacklevel=3))
        return cls(run, model, path, device, memory_mb)

    @property
    def grid(self) -> dict[str, np.ndarray]:
        """Nodal coordinates of the output fields: ``t``, ``x`` (Burgers) or ``y``, ``x``."""
        return self.family.coordinates()

    @property
    def exact_gradients(self) -> bool:
        """Whether :meth:`evaluate` gives exact gradients in the instances: the family is ``differentiable`` and every
        step of its product has them (not the Neo-Hookean solids' sweeps after their coarse minimiser, whose
        linearisation moves with the instance, unless Newton's polish follows them: the adjoint of the minimiser it
        ends at; not a residual's correction, nor a polish of V-cycles). Without them ``deepfusion invert`` takes
        central differences of the fields."""
        return self.product.exact_parameter_gradients

    @property
    def parameter_name(self) -> str:
        """The keyword the family's instances go by, its parameter's own name (:class:`~diffnet.protocol.family.ParameterSpec`):
        ``"c"`` for Burgers, ``"a"`` for the KL families' coefficient rows, ``"hole"`` for a plugin's; ``surrogate(**{name:
        rows})`` and ``surrogate(rows)`` solve them (and ``nu=`` where the family takes fields)."""
        return self.family.parameters.name

    @property
    def parameter_range(self) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
        """The training range of the parameter: ``(low, high)`` of every entry, or, for a family whose
        entries have ranges of their own, two arrays of the instance's shape."""
        spec = self.family.parameters
        return spec.bounds() if spec.per_entry else (spec.low, spec.high)

    def instances(self, values=None, /, **named) -> np.ndarray:
        """The checked instance array the fields are computed from: ``values`` of the family's parameter
        (:attr:`parameter_name`), or the instances under the family's own names (its parameter's, e.g. ``c=[3.5]`` or
        ``a=rows``; every entry's, e.g. ``hole_x=[...], hole_r=[...]``; its field input's, e.g. ``nu=fields``;
        :func:`~deepfusion.configuration.inputs.by_name`). Instances outside the family's physical limits raise
        :class:`InputError`."""
        if values is not None:
            if self.parameter_name in named:
                raise InputError(f"{self.parameter_name}: the instances are given twice (also positionally)")
            named = {self.parameter_name: values, **named}
        keywords, names = by_name(self.family, named)
        return instance_parameters(self.family, **keywords, names=names)

    def __call__(self, values=None, /, *, polish: int = 0, outputs=None, **named):
        """Fields of the instances: ``values`` of the family's parameter, or under the family's own names (its
        parameter's, e.g. ``c=[3.5, 4.0]`` or ``a=rows``; every entry's, e.g. ``hole_x=[0.5], hole_y=[0.5],
        hole_r=[0.1, 0.15], nu=[0.3]``; its field input's, e.g. ``nu=fields``).

        With ``outputs`` (names of :attr:`outputs`: ``"u"``, the family's derived fields such as ``"stress"`` or
        ``"von_mises"``, its quantities such as ``"K_t"``) a dict of those, computed from the same fields.

        Parameters
        ----------
        values : array_like, optional
            The family's parameter (:attr:`parameter_name`): (S,) for a scalar one, (S, *shape) rows for a vector one.
        polish : int
            Then this many iterations of the family's polish step (V-cycles, Newton sweeps): a hybrid.
        outputs : list of str, optional
            Names of :attr:`outputs` to return, as a dict.
        **named
            The instances under the family's own names instead (:meth:`instances`).

        Returns
        -------
        numpy.ndarray or dict
            float64 fields (S, *grid), or (S, C, *grid) for C unknowns; with ``outputs`` a dict by name.
        """
        instances = self.instances(values, **named)
        u = self.fields(instances, polish=polish)
        return u if outputs is None else self.outputs_of(instances, u, outputs)

    def at(self, points, values=None, /, *, outputs=None, **named):
        """Values at ``points`` (P, d), x first, in the unit square or cube: each field read by the element's shape
        functions (the discretisation's own interpolation, :func:`diffnet.grid.points.values_at`). The instances as
        for :meth:`__call__`.

        Returns
        -------
        numpy.ndarray or dict
            (S, P), or (S, C, P) for C unknowns; with ``outputs`` (names of :attr:`outputs`) a dict by name, each
            derived field (S, [k,] P) at the points and each quantity (S,) as it is (it has no coordinates).
        """
        from diffnet.grid.points import read_at

        grid = tuple(self.family.resolution)
        weights = self._point_weights(points)  # checked before any field is computed; then read for every output
        instances = self.instances(values, **named)
        u = self.fields(instances)
        if outputs is None:
            return read_at(u, grid, weights)
        return {name: read_at(value, grid, weights) if value.shape[value.ndim - len(grid):] == grid else value
                for name, value in self.outputs_of(instances, u, outputs).items()}

    def _point_weights(self, points):
        """The shape functions' weights of ``points`` on the run's grid (:func:`diffnet.grid.points.point_weights`);
        bad points an :class:`InputError`."""
        from diffnet.grid.points import extent_of, point_weights

        try:
            return point_weights(tuple(self.family.resolution), points, extent_of(self.family))
        except ValueError as e:
            raise InputError(f"points: {e}") from None

    def evaluate(self, instances, points=None):
        """The fields of ``instances`` (a torch tensor of the family's parameter, (S, *shape), or (S,) for a scalar one)
        as a float64 torch tensor **differentiable in the instances**: ``loss.backward()`` or ``torch.autograd.grad``
        give exact gradients through the network, the coarse correction and the sweeps (the implicit function
        theorem, :mod:`diffnet.multigrid.sensitivity`), not a finite difference. With ``points`` (P, d), x first, the
        fields read there by the element's shape functions. One batch (no chunking: the graph is kept).

        Returns
        -------
        torch.Tensor
            (S, *grid) or (S, C, *grid); with ``points`` (S, P) or (S, C, P).

        Examples
        --------
        >>> a = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)   # doctest: +SKIP
        >>> s.evaluate(a, points=[[0.5, 0.5]]).sum().backward()              # a.grad: d u(0.5, 0.5) / d a
        """
        import torch

        from diffnet.grid.points import read_at

        if not isinstance(instances, torch.Tensor):
            raise InputError(f"instances: evaluate takes a torch tensor (surrogate(...) takes arrays), got "
                             f"{type(instances).__name__}")
        require(self.family, "differentiable", "Surrogate.evaluate")
        if not self.exact_gradients:
            raise InputError(f"Surrogate.evaluate: this run's product ({self.product.chain()}) has no exact gradients in "
                             f"the instances ({self.product.why_no_exact_gradients()}); take central differences of "
                             "surrogate(...) (deepfusion.analysis.inverse.differenced_forward)")
        self.instances(instances.detach().cpu().numpy())  # the call's checks: shape, finite, physical, in range
        weights = None if points is None else self._point_weights(points)
        p = instances.to(torch.float64)
        p = p if p.ndim > len(self.family.parameters.shape) else p[None]  # one instance without its batch axis
        u = self.product.differentiable(p)
        return u if weights is None else read_at(u, tuple(self.family.resolution), weights)

    def jacobian(self, instances, points=None):
        """d(fields) / d(instances), exact (:meth:`evaluate`'s gradients), by one backward pass over a batch of copies of
        each instance, one copy per output value (chunked by :attr:`chunk`; :func:`deepfusion.analysis.inverse.jacobian`):
        meant for values at a few ``points``.

        Returns
        -------
        numpy.ndarray
            (S, *out, *shape): out the shape of one instance's :meth:`evaluate` ((C,) P or *grid), shape the parameter's.
        """
        import torch

        from deepfusion.analysis.inverse import jacobian

        p = torch.as_tensor(np.asarray(instances, dtype=np.float64))
        out_shape = tuple(self.evaluate(p[:1], points).shape[1:])  # (and the checks)
        flat = lambda q: self.evaluate(q, points).reshape(len(q), -1)  # noqa: E731
        return np.stack([jacobian(flat, row, chunk=self.chunk).reshape(*out_shape, *p.shape[1:])
                         for row in p.numpy()])

    @property
    def outputs(self) -> tuple[str, ...]:
        """What ``outputs=`` may name: ``"u"``, the family's derived fields and its quantities of interest (read off
        one instance of the training range's centre on first use)."""
        if self._outputs is None:
            from deepfusion.analysis.derived import derived_fields, quantities

            spec = self.family.parameters
            low, high = spec.bounds()
            centre = ((np.asarray(low, dtype=np.float64) + np.asarray(high, dtype=np.float64)) / 2)[None]
            u = self.fields(centre)
            self._outputs = ("u", *derived_fields(self.family, centre, u), *quantities(self.family, centre, u))
        return self._outputs

    def outputs_of(self, instances: np.ndarray, fields: np.ndarray, names) -> dict[str, np.ndarray]:
        """The named outputs (:attr:`outputs`) of checked instances ``instances`` and their ``fields``."""
        from deepfusion.analysis.derived import derived_fields, quantities

        names = [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in self.outputs]
        if unknown:
            raise InputError(f"outputs: {', '.join(map(repr, unknown))} not among the {self.family.name} family's "
                             f"outputs ({', '.join(self.outputs)})")
        everything = {"u": fields}
        if any(n in self.outputs[1:] for n in names):
            everything |= derived_fields(self.family, instances, fields) | quantities(self.family, instances, fields)
        return {n: everything[n] for n in names}

    def fields(self, instances: np.ndarray, polish: int = 0, tiling=None) -> np.ndarray:
        """Fields of already checked instances (:meth:`instances`), ``chunk`` at a time.

        With a ``tiling`` (a domain split: :class:`deepfusion.parallel.halo.MPITiling`, collective over its
        ranks) the generator runs on this rank's tile of each field and every rank gets the
        gathered fields.

        The fields are (S, *grid), or (S, C, *grid) for a family of several unknowns (by name: :meth:`by_name`).

        ``polish`` > 0 improves them by that many classical iterations from the network's
        output (multigrid V-cycles for Poisson and reaction-diffusion, Newton sweeps of the
        conservative scheme for Burgers): "DiffNet + k cycles", a separate product from
        the pure network (polish = 0).
        """
        from deepfusion.analysis.inference import on_domain

        if not (isinstance(polish, (int, np.integer)) and 0 <= polish <= 1000):
            raise InputError(f"polish: must be an integer in 0..1000, got {polish!r}")
        u = self.product.fields(instances, self.chunk, tiling=tiling)
        if polish:
            require(self.family, "polish", "polish")
            try:
                u = on_domain(self.family, instances, self.family.polish(instances, u, int(polish)))
            except ValueError as e:
                raise InputError(str(e)) from None
        return u

    def clear_caches(self) -> None:
        """Forget what the product keeps per instance (coarse spaces, a cut domain's quadrature): the next fields pay
        their own set-up, as a timed comparison needs."""
        self.product.clear_caches()

    def by_name(self, fields: np.ndarray) -> dict[str, np.ndarray]:
        """Fields from :meth:`fields` by unknown: ``{"u": (S, *grid)}`` for one, ``{"u_x": ..., "u_y": ...}`` for
        several (the family's ``unknowns``, each (S, *grid)), the names the field files use."""
        from deepfusion.files.fields import by_unknown

        return by_unknown(fields, self.family.unknowns)

    def __repr__(self) -> str:
        p = self.config.problem
        return (f"Surrogate({self.family.name} {list(p.resolution)}: {self.product.chain()}, "
                f"checkpoint={str(self.checkpoint)!r}, device={self.device!r})")


def _device(device: str) -> str:
    import torch

    if device == "cpu":
        return device
    if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise InputError(f"device: must be 'cpu', 'cuda' or 'cuda:I', got {device!r}")
    if not torch.cuda.is_available():
        raise InputError(f"device: {device!r} asked for, but torch sees no CUDA device")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise InputError(f"device: {device!r}, but only {torch.cuda.device_count()} CUDA devices are visible")
    return f"cuda:{index}"
