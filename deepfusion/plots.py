"""PNG figures: a run's loss curve, predicted vs reference fields, and the solve-time comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["plot_loss", "plot_fields", "plot_compare"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; cluster nodes have no display
    import matplotlib.pyplot as plt

    return plt


def plot_loss(metrics_path: Path, out: Path) -> Path:
    """Loss terms against optimiser step (log scale) from ``metrics.jsonl``."""
    plt = _pyplot()
    records = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    skip = {"epoch", "step", "lr", "samples_per_s", "compute_s", "comm_s", "ranks", "threads", "elapsed_s",
            "optimizer", "grad_norm", "evaluations", "samples_evaluated", "stage", "level", "grid"}
    fig, ax = plt.subplots(figsize=(6, 4))
    terms = [k for k in records[0] if k not in skip and k != "loss"]
    # The terms are drawn only when the loss is a sum of several.
    keys = ["loss"] + (terms if len(terms) > 1 else [])
    positive = all(r.get(k, 1.0) > 0 for r in records for k in keys)
    for key in keys:
        # Energies (reaction-diffusion) are negative near the solution: linear axis then.
        plot = ax.semilogy if positive else ax.plot
        plot([r["step"] for r in records if key in r], [r[key] for r in records if key in r], label=key)
    # Multigrid: a dashed line where each stage starts, labelled with its grid.
    prev = records[0]
    for r in records[1:]:
        if r.get("stage", 0) != prev.get("stage", 0) and r.get("optimizer") == "adam":
            ax.axvline(prev["step"], color="tab:red", linestyle="--", alpha=0.6)
            if "grid" in r:
                ax.annotate(f"{r['grid'][0]}²", (prev["step"], 1.0), xycoords=("data", "axes fraction"),
                            xytext=(2, -12), textcoords="offset points", fontsize=8, color="tab:red")
        prev = r
    if "grid" in records[0]:
        ax.annotate(f"{records[0]['grid'][0]}²", (0, 1.0), xycoords="axes fraction", xytext=(2, -12),
                    textcoords="offset points", fontsize=8, color="tab:red")
    switch = next((r["step"] for r in records if r.get("optimizer") == "lbfgs"), None)
    if switch is not None and records[0].get("optimizer") == "adam":
        ax.axvline(switch, color="grey", linestyle=":", label="Adam → L-BFGS")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (global mean)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_fields(
    pred: np.ndarray,
    ref: np.ndarray,
    extent: tuple[float, float, float, float],
    labels: list[str],
    axis_names: tuple[str, str],
    out: Path,
    ref_name: str = "reference",
    inputs: np.ndarray | None = None,
    input_labels: list[str] | None = None,
) -> Path:
    """One row per sample: predicted field, reference field and their difference (DiffNet − reference).

    ``extent`` is (x_min, x_max, y_min, y_max) of the image, ``axis_names`` the names of
    the horizontal and vertical axes (e.g. ``("x", "t")``). ``inputs`` (one field per
    sample, e.g. log10 of the diffusivity) adds a first column titled by ``input_labels``.
    The difference's colour scale is symmetric and clipped at the 99th percentile of its
    magnitude, so that a few large values (a shock, the outflow column) do not wash out
    the rest; its title gives the true maximum.
    """
    plt = _pyplot()
    s = len(pred)
    cols = 3 + (inputs is not None)
    fig, axes = plt.subplots(s, cols, figsize=(3.7 * cols, 2.9 * s), squeeze=False)
    for k in range(s):
        vmin, vmax = float(ref[k].min()), float(ref[k].max())
        diff = pred[k] - ref[k]
        peak = float(np.abs(diff).max())
        dmax = float(np.percentile(np.abs(diff), 99)) or peak or 1.0
        panels = [
            (pred[k], f"DiffNet, {labels[k]}", "viridis", vmin, vmax, "u"),
            (ref[k], f"{ref_name}, {labels[k]}", "viridis", vmin, vmax, "u"),
            (diff, f"DiffNet − {ref_name} (max |·| {peak:.2g})", "RdBu_r", -dmax, dmax, "difference"),
        ]
        if inputs is not None:
            data = inputs[k]
            panels.insert(0, (data, input_labels[k] if input_labels else "input", "cividis", float(data.min()),
                              float(data.max()), "log10 ν"))
        for ax, (data, title, cmap, lo, hi, label) in zip(axes[k], panels):
            im = ax.imshow(data, origin="lower", extent=extent, aspect="auto", cmap=cmap, vmin=lo, vmax=hi)
            ax.set_title(title, fontsize=8)
            ax.set_xlabel(axis_names[0])
            ax.set_ylabel(axis_names[1])
            extend = "both" if label == "difference" and peak > dmax else "neither"
            fig.colorbar(im, ax=ax, fraction=0.046, extend=extend).set_label(label, fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_compare(rows: list[dict], out: Path) -> Path:
    """Seconds per instance against grid size (log-log): classical assembly and solves, DiffNet inference."""
    plt = _pyplot()
    nodes = [int(np.prod(r["resolution"])) for r in rows]
    fem = rows[0]["reference"] == "fem"
    series = ([("fem_assembly_s", "FEM assembly", "o-"), ("fem_solve_s", "AMG-CG solve (incl. setup)", "s-"),
               ("fem_direct_solve_s", "direct LU solve", "x--")] if fem else [("fem_solve_s", "Godunov solve", "s-")])
    series += [("inference_single_s", "DiffNet, one instance", "^-"),
               ("inference_batched_per_instance_s", "DiffNet, per instance in a batch", "v-")]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, label, style in series:
        points = [(n, r[key]) for n, r in zip(nodes, rows) if r[key] is not None]
        if points:
            ax.loglog(*zip(*points), style, label=label)
    ax.set_xticks(nodes, ["×".join(map(str, r["resolution"])) for r in rows])
    ax.minorticks_off()
    # Ticks at 1, 2 and 5 per decade: a single grid's times span less than a decade, and
    # the default locator would then label one tick or none.
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if len(rows) == 1:
        ax.set_xlim(nodes[0] / 2, nodes[0] * 2)
    ax.set_xlabel("grid (nodes)")
    ax.set_ylabel("seconds per instance")
    threads = rows[0]["threads"]
    ax.set_title(f"{'FEM' if fem else 'Godunov'} vs DiffNet inference, {threads} thread{'s' if threads != 1 else ''}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
