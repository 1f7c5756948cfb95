"""The figures say what they show: labelled colour bars, the difference's sign and scale, readable ticks."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from deepfusion.files import plots


def _fields(inputs=None):
    y, x = np.mgrid[0:1:32j, 0:1:32j]
    ref = np.stack([np.sin(np.pi * x) * (1 - y), np.cos(np.pi * x) * y])
    pred = ref + 1e-3 * np.sin(7 * x)
    pred[:, :, -1] += 0.5  # one bad column (Burgers' outflow), far above the rest of the error
    titles = ["log10 ν, a=0.5", "log10 ν, a=1"]
    coords = {"t": np.linspace(0, 1, 32), "x": np.linspace(0, 1, 32)}
    return plots._fields_figure(pred, ref, coords, ["c = 3", "c = 4"], ("DiffNet", "Godunov"),
                                None if inputs is None else (inputs, titles), errors=[0.012, 0.034]), pred - ref


def test_fields_colour_bars_are_labelled_and_the_difference_is_signed():
    fig, _ = _fields()
    try:
        image_axes = [ax for ax in fig.axes if ax.get_images()]
        bars = [ax for ax in fig.axes if not ax.get_images()]
        assert len(image_axes) == 6 and len(bars) == 6
        assert [b.get_ylabel() for b in bars[:3]] == ["u", "u", "difference"]
        assert image_axes[2].get_title().startswith("DiffNet − Godunov (max |·| 0.5")
        # The instance by its parameter in every panel of its row; the network's error in the network's only.
        assert image_axes[0].get_title() == "DiffNet, c = 3\nrel. L2 0.012"
        assert image_axes[1].get_title() == "Godunov, c = 3" and image_axes[4].get_title() == "Godunov, c = 4"
    finally:
        plots._pyplot().close(fig)
    # A product finished by its family's polish (model.polish) is named as such, never as the network alone.
    pred, ref = np.zeros((1, 8, 8)), np.ones((1, 8, 8))
    coords = {"t": np.linspace(0, 1, 8), "x": np.linspace(0, 1, 8)}
    fig = plots._fields_figure(pred, ref, coords, ["c = 3"], ("DiffNet + 2 Newton sweeps", "Godunov"), None)
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_images()]
        assert titles[0] == "DiffNet + 2 Newton sweeps, c = 3" and titles[2].startswith("DiffNet + 2 Newton sweeps − ")
    finally:
        plots._pyplot().close(fig)


def test_difference_scale_is_not_set_by_one_outflow_column():
    fig, diff = _fields()
    try:
        lo, hi = [ax for ax in fig.axes if ax.get_images()][2].get_images()[0].get_clim()
        assert lo == -hi  # symmetric: white is zero error
        assert hi == pytest.approx(np.percentile(np.abs(diff[0, 1:-1, 1:-1]), 99))
        assert hi < 0.1 * np.abs(diff[0]).max()
    finally:
        plots._pyplot().close(fig)


def test_elliptic_rows_start_with_the_coefficient_field():
    log_nu = np.random.default_rng(0).normal(size=(2, 32, 32))
    fig, _ = _fields(inputs=log_nu)
    try:
        image_axes = [ax for ax in fig.axes if ax.get_images()]
        assert len(image_axes) == 8
        assert image_axes[0].get_title() == "log10 ν, a=0.5"
        assert [ax for ax in fig.axes if not ax.get_images()][0].get_ylabel() == "log10 ν"
    finally:
        plots._pyplot().close(fig)


def test_pareto_plot_shows_every_sweep_point_and_the_network():
    report = {"problem": "burgers", "resolution": [64, 64], "reference": "Godunov (8192 cells, second order)",
              "methods": {"godunov1": "Godunov, first order",
                          "godunov2": "Godunov, second order (minmod MUSCL, SSP-RK2)"},
              "search": [{"method": "godunov1", "grid": g, "error": 1.0 / g, "seconds": 1e-6 * g} for g in (8, 16, 32)]
              + [{"method": "godunov2", "grid": g, "error": 0.5 / g, "seconds": 1.2e-6 * g} for g in (8, 16)],
              "rows": [{"device": "cpu", "threads": 1, "diffnet_error": 0.02, "floor": 0.015,
                        "diffnet_s_single": 4e-3, "diffnet_s_batched": 3e-3}]}
    fig = plots._pareto_figure(report)
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == ax.get_yscale() == "log"
        labels = ax.get_legend_handles_labels()[1]
        assert labels[:2] == ["Godunov, first order", "Godunov, second order (minmod MUSCL, SSP-RK2)"]
        assert "DiffNet, cpu, 1 thr., batched" in labels and "floor of the 64×64 grid" in labels
        assert sorted(t.get_text() for t in ax.texts) == sorted(["8", "16", "32", "8", "16"])
        assert ax.get_xlabel() == "seconds per instance" and "Godunov" in ax.get_ylabel()
    finally:
        plots._pyplot().close(fig)


def test_plot_fields_writes_a_png(tmp_path):
    y, x = np.mgrid[0:1:8j, 0:1:8j]
    out = plots.plot_fields(x[None], y[None], {"t": np.linspace(0, 1, x.shape[0]), "x": np.linspace(0, 1, x.shape[1])},
                            ["c=3"], tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_instances_are_labelled_by_their_parameters_values_and_names():
    from deepfusion.analysis.inference import instance_labels
    from diffnet.protocol.family import ParameterSpec

    class Family:
        def __init__(self, spec):
            self.parameters = spec

    named = ParameterSpec("h", (3,), 0.0, 1.0, names=("cx", "cy", "r"))
    assert instance_labels(Family(named), np.array([[0.5, 0.25, 0.125]])) == ["cx = 0.5, cy = 0.25, r = 0.125"]
    assert instance_labels(Family(ParameterSpec("c", (), 1.0, 5.0)), np.array([4.1])) == ["c = 4.1"]
    kl = ParameterSpec("a", (6,), -3.0, 3.0)
    assert instance_labels(Family(kl), np.array([[0.31, -1.2, 2.9, 0.5, 1.0, 2.0]])) == ["a = (0.31, -1.2, 2.9, 0.5, …)"]


@pytest.mark.parametrize("grid, name", [([64, 64], "64²"), ([32, 32, 32], "32³"), ([33, 65], "33×65"),
                                        ([9, 17, 17], "9×17×17")])
def test_a_grid_is_named_by_both_sizes_where_they_differ(grid, name):
    assert plots.grid_name(grid) == name


def test_the_loss_plot_smooths_a_noisy_loss_and_marks_levels_and_a_resume():
    rng = np.random.default_rng(0)
    records = []
    for step in range(1, 201):
        level = 0 if step <= 100 else 1
        # A resume at step 150: the recorder's clock starts again.
        elapsed = step * 0.1 if step < 150 else (step - 150) * 0.1
        records.append({"step": step, "loss": float(np.exp(-step / 80) * (1 + 0.5 * rng.random())), "visit": level,
                        "grid": [33, 65] if level else [17, 33], "elapsed_s": elapsed})
    fig = plots._loss_figure(records)
    try:
        ax = fig.axes[0]
        raw, smooth = ax.get_lines()[:2]
        noise = lambda y: np.abs(np.diff(np.log(y), 2)).mean()  # noqa: E731
        assert noise(smooth.get_ydata()) < 0.2 * noise(raw.get_ydata())
        assert ax.get_yscale() == "log"
        assert sorted(t.get_text() for t in ax.texts) == ["17×33", "33×65"]
        assert "resumed" in ax.get_legend_handles_labels()[1]
        resumed = [line for line in ax.get_lines() if line.get_label() == "resumed"]
        assert resumed[0].get_xdata()[0] == 150
    finally:
        plots._pyplot().close(fig)
