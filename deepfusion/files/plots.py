"""PNG figures: a run's loss curve, predicted vs reference fields, and the solve-time comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["grid_name", "plot_loss", "plot_fields", "plot_deformed", "plot_streamlines", "plot_pareto", "plot_statistics", "mid_plane",
           "plot_posterior"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; cluster nodes have no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, dpi: int) -> Path:
    # The figures are built apart from saving so that tests can read their titles, labels and scales.
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    _pyplot().close(fig)
    return out


def grid_name(grid) -> str:
    """``64²``, ``32³``, or every size where they differ: ``33×65``."""
    grid = [int(n) for n in grid]
    if len(set(grid)) == 1 and len(grid) in (2, 3):
        return f"{grid[0]}{'²' if len(grid) == 2 else '³'}"
    return "×".join(map(str, grid))


def _smoothed(values: np.ndarray) -> np.ndarray:
    """A centred moving average over about a twentieth of the records (at least 5): the trend of a
    loss that is batch-to-batch noise (an energy's value depends on each batch's instances)."""
    window = max(5, len(values) // 20) | 1
    if len(values) < window:
        return values
    padded = np.pad(values, window // 2, mode="edge")
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def plot_loss(metrics_path: Path, out: Path) -> Path:
    """Loss terms against optimiser step from ``metrics.jsonl`` (log scale where positive): each as logged,
    faint, with its moving average over it; dashed lines where a multigrid level (labelled with its grid) or
    a stage starts, a dotted one where the run was resumed."""
    return _save(_loss_figure([json.loads(line) for line in Path(metrics_path).read_text().splitlines()
                               if line.strip()]), out, 120)


def _loss_figure(records: list[dict]):
    plt = _pyplot()
    skip = {"epoch", "step", "lr", "samples_per_s", "compute_s", "comm_s", "ranks", "threads", "elapsed_s",
            "optimizer", "grad_norm", "evaluations", "samples_evaluated", "visit", "stage", "kind", "level", "grid",
            "evaluations_per_iteration", "line_search_failures", "skipped_pairs", "stop_reason", "dtype"}
    fig, ax = plt.subplots(figsize=(6, 4))
    terms = [k for k in records[0] if k not in skip and k != "loss"]
    # The terms are drawn only when the loss is a sum of several.
    keys = ["loss"] + (terms if len(terms) > 1 else [])
    positive = all(r.get(k, 1.0) > 0 for r in records for k in keys)
    if positive:  # energies (reaction-diffusion) are negative near the solution: linear axis then
        ax.set_yscale("log")
    for key in keys:
        steps = np.array([r["step"] for r in records if key in r])
        values = np.array([r[key] for r in records if key in r], dtype=float)
        (line,) = ax.plot(steps, values, alpha=0.3, linewidth=0.8)
        ax.plot(steps, _smoothed(values), color=line.get_color(), label=f"{key} (moving average)")
    # Multigrid: a dashed line where each visit starts, labelled with its grid ("stage" in an earlier version's metrics).
    visit = lambda r: r.get("visit", r.get("stage", 0))  # noqa: E731
    prev = records[0]
    for r in records[1:]:
        if visit(r) != visit(prev) and r.get("optimizer") != "lbfgs":
            ax.axvline(prev["step"], color="tab:red", linestyle="--", alpha=0.6)
            if "grid" in r:
                ax.annotate(grid_name(r["grid"]), (prev["step"], 1.0), xycoords=("data", "axes fraction"),
                            xytext=(2, -12), textcoords="offset points", fontsize=8, color="tab:red")
        prev = r
    if "grid" in records[0]:
        ax.annotate(grid_name(records[0]["grid"]), (0, 1.0), xycoords="axes fraction", xytext=(2, -12),
                    textcoords="offset points", fontsize=8, color="tab:red")
    # A resumed run's clock starts again: where elapsed_s falls, the run was restarted from a checkpoint.
    resumed = [b["step"] for a, b in zip(records, records[1:]) if b.get("elapsed_s", 0) < a.get("elapsed_s", 0)]
    for k, step in enumerate(resumed):
        ax.axvline(step, color="tab:purple", linestyle=":", label="resumed" if k == 0 else None)
    switch = next((r["step"] for r in records if r.get("optimizer") == "lbfgs"), None)
    if switch is not None and records[0].get("optimizer") != "lbfgs":
        ax.axvline(switch, color="grey", linestyle=":", label="Adam → L-BFGS")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (global mean)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_fields(
    pred: np.ndarray | dict[str, np.ndarray],
    ref: np.ndarray | dict[str, np.ndarray],
    coords: dict[str, np.ndarray],
    labels: list[str],
    out: Path,
    inputs: tuple[np.ndarray, list[str]] | None = None,
    domain: np.ndarray | None = None,
    product: str = "DiffNet",
) -> Path:
    """One row per sample: predicted field, reference field and their difference (DiffNet − reference); ``product``
    names the predicted fields (e.g. "DiffNet + 2 Newton sweeps" for a polished product).
    For a family of several fields, ``pred`` and ``ref`` are dicts by field name, each
    (S, *grid): one row per sample and field, each row with its own colour scale.

    ``labels`` name each sample's instance (its parameters); the prediction's relative L2 error against
    ``ref`` per sample (and field) goes in its panel only.

    ``coords`` are the fields' two nodal coordinate arrays (e.g. ``{"t": ..., "x": ...}``: the
    vertical axis first). ``inputs``, (fields, titles) with one field per sample (e.g. log10 of the
    diffusivity), adds a first column. ``domain``, the signed distance of a domain cut out of the
    grid (one field per sample), blanks the outside and draws the boundary.
    The difference's colour scale is symmetric and clipped at the 99th percentile of its
    magnitude away from the edges, so that a few large values (a shock, the outflow
    column) do not wash out the rest; its title gives the true maximum.
    """
    def relative(p: np.ndarray, r: np.ndarray) -> list[float]:  # per sample, over all nodes (zero outside a domain)
        return list(np.linalg.norm((p - r).reshape(len(r), -1), axis=1) / np.linalg.norm(r.reshape(len(r), -1), axis=1))

    errors = {k: relative(pred[k], ref[k]) for k in pred} if isinstance(pred, dict) else relative(pred, ref)
    return _save(_fields_figure(pred, ref, coords, labels, (product, "reference"), inputs, domain, errors), out, 110)


def _fields_figure(pred, ref, coords, labels, names, inputs, domain=None, errors=None):
    product, ref_name = names  # what the predicted fields are ("DiffNet", or a polished product), what they are set against
    (vertical, ys), (horizontal, xs) = coords.items()
    extent, axis_names = (xs[0], xs[-1], ys[0], ys[-1]), (horizontal, vertical)
    plt = _pyplot()
    if not isinstance(pred, dict):  # one field: rows are samples
        pred, ref, errors = {"u": pred}, {"u": ref}, None if errors is None else {"u": errors}
    rows = [(k, name) for k in range(len(next(iter(pred.values())))) for name in pred]
    several = len(pred) > 1
    cols = 3 + (inputs is not None)
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.7 * cols, 2.9 * len(rows)), squeeze=False)
    for row, (k, name) in enumerate(rows):
        p, r = pred[name][k], ref[name][k]
        vmin, vmax = float(r.min()), float(r.max())
        diff = p - r
        outside = None if domain is None else domain[k] > 0
        label_k = f"{name}, {labels[k]}" if several else labels[k]
        error = None if errors is None else errors[name][k]
        peak = float(np.abs(diff).max())
        # The edges are left out of the scale: at 64² one outflow column is 1.6 % of the
        # pixels, more than a 99th percentile alone would clip.
        core = diff[1:-1, 1:-1] if min(diff.shape) > 2 else diff
        dmax = float(np.percentile(np.abs(core), 99)) or peak or 1.0
        panels = [
            (p, f"{product}, {label_k}" + ("" if error is None else f"\nrel. L2 {error:.3g}"),
             "viridis", vmin, vmax, name),
            (r, f"{ref_name}, {label_k}", "viridis", vmin, vmax, name),
            (diff, f"{product} − {ref_name} (max |·| {peak:.2g})", "RdBu_r", -dmax, dmax, "difference"),
        ]
        if inputs is not None:
            data, titles = inputs[0][k], inputs[1]
            panels.insert(0, (data, titles[k] if titles else "input", "cividis", float(data.min()),
                              float(data.max()), "log10 ν"))
        for ax, (data, title, cmap, lo, hi, label) in zip(axes[row], panels):
            if outside is not None and label != "log10 ν":  # the field lives inside the domain only
                data = np.ma.masked_where(outside, data)
            im = ax.imshow(data, origin="lower", extent=extent, aspect="auto", cmap=cmap, vmin=lo, vmax=hi)
            if outside is not None:
                ys, xs = (np.linspace(a, b, n) for a, b, n in ((extent[2], extent[3], data.shape[0]),
                                                                (extent[0], extent[1], data.shape[1])))
                ax.contour(xs, ys, domain[k], levels=[0.0], colors="k", linewidths=0.8)
            ax.set_title(title, fontsize=8)
            ax.set_xlabel(axis_names[0])
            ax.set_ylabel(axis_names[1])
            extend = "both" if label == "difference" and peak > dmax else "neither"
            fig.colorbar(im, ax=ax, fraction=0.046, extend=extend).set_label(label, fontsize=8)
    return fig


def plot_deformed(pred: np.ndarray, ref: np.ndarray, coords: dict[str, np.ndarray], labels: list[str],
                  out: Path, domain: np.ndarray | None = None) -> Path:
    """The deformed shape: per sample, the grid moved by the network's displacement and by the reference's,
    coloured by the displacement's magnitude, the undeformed outline dashed. ``pred``, ``ref``: (S, 2, N_y, N_x)
    displacements (x component first); one magnification for the whole figure, the largest displacement drawn
    as a tenth of the body's size (the title says by how much). ``domain``, the signed distance of a domain cut
    out of the grid (S, N_y, N_x): only the elements whose four nodes lie inside it are drawn."""
    plt = _pyplot()
    (vertical, ys), (horizontal, xs) = coords.items()
    x, y = np.meshgrid(xs, ys)
    size = max(float(np.ptp(xs)), float(np.ptp(ys)))
    peak = max(float(np.sqrt((ref**2).sum(axis=1)).max()), 1e-300)
    scale = 0.1 * size / peak
    magnitude = [np.sqrt((f**2).sum(axis=1)) for f in (pred, ref)]
    lo, hi = 0.0, max(float(m.max()) for m in magnitude)
    fig, axes = plt.subplots(len(pred), 2, figsize=(7.4, 3.2 * len(pred)), squeeze=False)
    for k in range(len(pred)):
        for ax, field, norm, who in zip(axes[k], (pred, ref), magnitude, ("DiffNet", "reference")):
            colour, shading = norm[k], "gouraud"
            if domain is not None:  # per element (gouraud shading cannot leave elements out), inside ones only
                outside = domain[k] > 0
                cut = outside[:-1, :-1] | outside[1:, :-1] | outside[:-1, 1:] | outside[1:, 1:]
                mean = (colour[:-1, :-1] + colour[1:, :-1] + colour[:-1, 1:] + colour[1:, 1:]) / 4
                colour, shading = np.ma.masked_where(cut, mean), "flat"
            mesh = ax.pcolormesh(x + scale * field[k, 0], y + scale * field[k, 1], colour, shading=shading,
                                 cmap="viridis", vmin=lo, vmax=hi)
            ax.plot([xs[0], xs[-1], xs[-1], xs[0], xs[0]], [ys[0], ys[0], ys[-1], ys[-1], ys[0]], "k--", lw=0.6)
            ax.set_aspect("equal")
            ax.set_title(f"{who}, {labels[k]}", fontsize=8)
            ax.set_xlabel(horizontal)
            ax.set_ylabel(vertical)
            fig.colorbar(mesh, ax=ax, fraction=0.046).set_label("|u|", fontsize=8)
    fig.suptitle(f"deformed shape: displacements drawn ×{scale:.3g} (the largest a tenth of the body)", fontsize=9)
    return _save(fig, out, 110)


def plot_streamlines(pred: np.ndarray, ref: np.ndarray, background: tuple[np.ndarray, np.ndarray], name: str,
                     coords: dict[str, np.ndarray], labels: list[str], out: Path) -> Path:
    """A flow: per sample, the streamlines of the network's velocity and of the reference's over a field of each
    (``background``: the vorticity, or the speed; ``name`` says which), one diverging colour scale for the whole
    figure. ``pred``, ``ref``: (S, 2, N_y, N_x) velocities (x component first) on a uniform grid."""
    plt = _pyplot()
    (vertical, ys), (horizontal, xs) = coords.items()
    peak = max(float(np.abs(b).max()) for b in background)
    peak = min(peak, max(float(np.percentile(np.abs(b), 99)) for b in background)) or 1.0  # corners' singularities
    aspect = (xs[-1] - xs[0]) / (ys[-1] - ys[0])
    if aspect > 2.0:  # a long domain (a channel): wide panels, the network's above the reference's
        axes = plt.subplots(2 * len(pred), 1, figsize=(8.0, 2 * len(pred) * (8.0 / aspect + 0.9)), squeeze=False)[1]
        fig, axes = axes[0, 0].figure, axes.reshape(len(pred), 2)
    else:
        fig, axes = plt.subplots(len(pred), 2, figsize=(7.4, 3.4 * len(pred)), squeeze=False)
    for k in range(len(pred)):
        for ax, field, colour, who in zip(axes[k], (pred, ref), background, ("DiffNet", "reference")):
            mesh = ax.pcolormesh(xs, ys, colour[k], shading="gouraud", cmap="RdBu_r", vmin=-peak, vmax=peak)
            ax.streamplot(xs, ys, field[k, 0], field[k, 1], color="k", linewidth=0.5, density=1.2, arrowsize=0.6)
            ax.set_aspect("equal")
            ax.set_xlim(xs[0], xs[-1])
            ax.set_ylim(ys[0], ys[-1])
            ax.set_title(f"{who}, {labels[k]}", fontsize=8)
            ax.set_xlabel(horizontal)
            ax.set_ylabel(vertical)
            fig.colorbar(mesh, ax=ax, fraction=0.046).set_label(name, fontsize=8)
    fig.suptitle(f"streamlines over the {name} (its scale clipped at the 99th percentile)", fontsize=9)
    return _save(fig, out, 110)


def plot_pareto(report: dict, out: Path) -> Path:
    """Error against seconds per instance (log-log): the classical search's configurations and the DiffNet's
    inference times at its error, with the grid's floor; what is left of and below wins."""
    return _save(_pareto_figure(report), out, 120)


def _pareto_figure(report: dict):
    plt = _pyplot()
    names = report.get("methods", {})  # method -> what it is, as the family's classical capability names them
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for method in dict.fromkeys(p["method"] for p in report["search"]):
        pts = [p for p in report["search"] if p["method"] == method]
        ax.loglog([p["seconds"] for p in pts], [p["error"] for p in pts], "o-", ms=4, label=names.get(method, method))
        for p in pts:
            ax.annotate(str(p["grid"]), (p["seconds"], p["error"]), xytext=(3, 3), textcoords="offset points",
                        fontsize=6)
    markers = iter("^v<>Dsp")
    for row in report["rows"]:
        m = next(markers, "*")
        who = f"{row.get('product', 'DiffNet')}, {row['device']}, {row['threads']} thr."
        ax.loglog([row["diffnet_s_single"]], [row["diffnet_error"]], m, mfc="none", ms=8, label=f"{who}, one")
        ax.loglog([row["diffnet_s_batched"]], [row["diffnet_error"]], m, ms=8, label=f"{who}, batched")
    row = report["rows"][0]
    ax.axhline(row["diffnet_error"], color="grey", lw=0.8, ls=":")
    ax.axhline(row["floor"], color="tab:red", lw=0.8, ls="--", label=f"floor of the {'×'.join(map(str, report['resolution']))} grid")
    ax.set_xlabel("seconds per instance")
    ax.set_ylabel(f"relative L2 error vs {report['reference']}", fontsize=8)
    ax.set_title(f"{report['problem']}: classical solves (labelled by grid) and DiffNet", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    return fig


def mid_plane(coords: dict[str, np.ndarray]) -> tuple[int, str, dict[str, np.ndarray]]:
    """For a 3-D grid's coordinates, the plane a PNG shows: the index of the first axis's middle node,
    its label (``"z = 0.50"``) and the plane's two coordinate arrays."""
    axis, *rest = list(coords)
    mid = len(coords[axis]) // 2
    return mid, f"{axis} = {coords[axis][mid]:.2f}", {k: coords[k] for k in rest}


def plot_statistics(fields: dict[str, np.ndarray], coords: dict[str, np.ndarray], axis_names: tuple[str, str],
                    out: Path) -> Path:
    """One panel per statistics field (mean, std, and the classical ones when present), labelled colour bars;
    a mean and its classical counterpart share one colour scale, as do the two standard deviations.
    With ``inside_fraction`` (a domain that moves with the instance) that field is not a panel: the nodes
    no sample's domain holds are blank, and every panel draws where half the samples' domains end
    (solid) and where every sample's does (dashed)."""
    plt = _pyplot()
    plane = ""
    if len(coords) == 3:  # 3-D: the mid-plane (the statistics file holds the volumes)
        mid, label, coords = mid_plane(coords)
        fields = {k: v[mid] for k, v in fields.items()}
        plane = f", {label}"
    first, second = (coords[n] for n in list(coords))
    extent = (float(second[0]), float(second[-1]), float(first[0]), float(first[-1]))
    fraction = fields.get("inside_fraction")
    names = [k for k in fields if k != "inside_fraction"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.9 * len(names), 3.2), squeeze=False)
    def statistic(name: str) -> tuple[str, str]:  # "classical_std_u_x" -> ("std", "u_x"); "mean" -> ("mean", "u")
        rest = name.removeprefix("classical_")
        kind = "std" if rest.startswith("std") else "mean"
        return kind, rest[len(kind) + 1:] or "u"

    for ax, name in zip(axes[0], names):
        kind, of = statistic(name)
        group = [fields[k] for k in names if statistic(k) == (kind, of)]
        lo, hi = min(float(np.nanmin(g)) for g in group), max(float(np.nanmax(g)) for g in group)
        im = ax.imshow(fields[name], origin="lower", extent=extent, aspect="auto", vmin=lo, vmax=hi,
                       cmap="viridis" if kind == "mean" else "magma")
        if fraction is not None:
            ys, xs = np.linspace(extent[2], extent[3], fraction.shape[0]), np.linspace(extent[0], extent[1], fraction.shape[1])
            if fraction.min() < 0.5 < fraction.max():
                ax.contour(xs, ys, fraction, levels=[0.5], colors="k", linewidths=0.8)
            if fraction.max() >= 1.0 > fraction.min():
                ax.contour(xs, ys, fraction, levels=[1.0 - 1e-9], colors="k", linewidths=0.6, linestyles="--")
        who = "classical" if name.startswith("classical") else "DiffNet"
        ax.set_title(f"{who}: {'mean' if kind == 'mean' else 'standard deviation'} of {of}{plane}", fontsize=8)
        ax.set_xlabel(axis_names[0])
        ax.set_ylabel(axis_names[1])
        fig.colorbar(im, ax=ax, fraction=0.046).set_label(kind, fontsize=8)
    return _save(fig, out, 110)


def plot_posterior(observed: np.ndarray, sides: dict[str, dict], names: list[str], out: Path) -> Path:
    """An inverse problem's answer: predicted against observed values at the MAP, and each parameter's marginal
    (MCMC histogram where sampled, the Laplace Gaussian, the MAP), per side (``sides``: name -> ``predicted``,
    ``map``, ``std`` and optionally ``samples``)."""
    return _save(_posterior_figure(observed, sides, names), out, 110)


def _posterior_figure(observed, sides, names):
    plt = _pyplot()
    m = len(names)
    cols = min(4, m) + 1
    rows = -(-m // (cols - 1))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.3 * rows), squeeze=False)
    ax = axes[0, 0]
    for (side, data), colour in zip(sides.items(), ("tab:blue", "tab:orange")):
        ax.plot(observed, data["predicted"], "o", ms=3, color=colour, label=f"{side} MAP")
    low, high = float(np.min(observed)), float(np.max(observed))
    ax.plot([low, high], [low, high], color="grey", lw=0.8)
    ax.set_xlabel("observed", fontsize=8)
    ax.set_ylabel("predicted", fontsize=8)
    ax.legend(fontsize=6)
    for r in range(1, rows):
        axes[r, 0].axis("off")
    for j, name in enumerate(names):
        ax = axes[j // (cols - 1), 1 + j % (cols - 1)]
        for (side, data), colour in zip(sides.items(), ("tab:blue", "tab:orange")):
            centre, spread = data["map"][j], max(data["std"][j], 1e-12)
            if data.get("samples") is not None:
                ax.hist(data["samples"][:, j], bins=40, density=True, alpha=0.35, color=colour, label=f"{side} MCMC")
            x = np.linspace(centre - 4 * spread, centre + 4 * spread, 200)
            ax.plot(x, np.exp(-0.5 * ((x - centre) / spread) ** 2) / (spread * np.sqrt(2 * np.pi)), color=colour,
                    lw=1, label=f"{side} Laplace")
            ax.axvline(centre, color=colour, lw=0.8, ls="--")
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=6)
    for j in range(m, rows * (cols - 1)):
        axes[j // (cols - 1), 1 + j % (cols - 1)].axis("off")
    axes[0, 1].legend(fontsize=5)
    fig.suptitle("the MAP's predictions, and each parameter's posterior", fontsize=9)
    return fig
