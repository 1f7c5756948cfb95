"""A parameter sweep with a trained Burgers run: the solution at the final time for many values of c,
in one batched call, drawn as one figure.

    python examples/sweep_plot.py runs/burgers --out sweep.png [--count 25]
"""

import argparse

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np

from deepfusion import Surrogate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory of a Burgers run")
    parser.add_argument("--out", default="sweep.png", help="PNG to write")
    parser.add_argument("--count", type=int, default=25, help="values of c across the training range")
    args = parser.parse_args()

    surrogate = Surrogate.load(args.run)
    if surrogate.parameter_name != "c":
        parser.error(f"{args.run} is a {surrogate.family.name} run; this sweep is over Burgers' c")
    c = np.linspace(*surrogate.parameter_range, args.count)
    u = surrogate(c=c)  # (count, N_t, N_x), one call
    x, t = surrogate.grid["x"], surrogate.grid["t"]
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    colours = plt.cm.viridis(np.linspace(0, 1, len(c)))
    for ck, uk, colour in zip(c, u, colours):
        ax.plot(x, uk[-1], color=colour, lw=1)
    bar = fig.colorbar(plt.cm.ScalarMappable(plt.Normalize(c[0], c[-1]), "viridis"), ax=ax)
    bar.set_label("initial-condition parameter c")
    ax.set(xlabel="x", ylabel=f"u(t = {t[-1]:.3g}, x)", title=f"DiffNet sweep over c ({len(c)} instances)")
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: u at t = {t[-1]:.3g} for {len(c)} values of c in [{c[0]:g}, {c[-1]:g}]")


if __name__ == "__main__":
    main()
