"""What the loss does at a multigrid level change, split into its parts, from a run's own checkpoints.

For each level change of a multigrid run (a visit ending on a coarser grid than the next),
from the checkpoint written at the end of the coarse visit, over the training set:

* ``coarse_loss``: the coarse generator's loss on its own (rediscretised) grid;
* ``galerkin_loss``: the *fine* loss of the coarse solution prolonged to the fine grid,
  E_h(P u_H), the coarse generator on the coarse grid's exact inputs;
* ``new_level_loss``: the fine loss of the new level's first output, the stack as the
  checkpoint holds it (its new head is still zero, so this is the coarse generator run on
  the fine inputs resampled to the coarse grid, prolonged: it differs from the
  Galerkin loss only through that resampling);
* ``first_logged_loss``: the first metrics line on the new level (after ``log_every``
  steps of a fresh Adam), and ``last_logged_loss`` on the old one.

The run must keep the checkpoint at the visit's end (``train.keep_checkpoints = 0``). Prints JSON.

    python benchmarks/level_change.py RUN_DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _mean_loss(generator, problem, params) -> float:
    import torch

    from deepfusion.training.stepper import loss_sum

    weight = next(generator.parameters())
    with torch.no_grad():
        p = torch.as_tensor(params, dtype=weight.dtype)
        return float(loss_sum(generator.eval(), problem, p)[0]) / len(params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()

    from deepfusion.configuration.run import Run
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint
    from deepfusion.training.rundir import run_config, trained_model
    from deepfusion.configuration.schedule import build_schedule
    from diffnet.generators.galerkin import GalerkinLoss

    cfg = run_config(args.run_dir)
    visits = build_schedule(cfg)
    saved = {load_checkpoint(path).step: path for path in checkpoint_files(args.run_dir / "checkpoints")}
    records = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines()]
    on_grid = Run.from_config(cfg.replace(multigrid=dataclasses.replace(cfg.multigrid, coarse_loss="rediscretised")))
    params = on_grid.training
    changes = []
    for old, new in zip(visits, visits[1:]):
        if new.level <= old.level:
            continue
        if old.end not in saved:
            raise SystemExit(f"level_change.py: no checkpoint at step {old.end} (the end of visit {old.index}); "
                             f"train with --set train.keep_checkpoints=0")
        _, model, _ = trained_model(args.run_dir, saved[old.end], lambda line: None)
        schedule = on_grid.schedule(model)
        coarse_target, fine_target = schedule.target(old), schedule.target(new)
        coarse_gen, coarse = coarse_target.generator, coarse_target.family
        fine_gen, fine = fine_target.generator, fine_target.family
        changes.append({
            "from_grid": list(old.grid), "to_grid": list(new.grid), "step": old.end,
            "coarse_loss": _mean_loss(coarse_gen, coarse, params),
            "galerkin_loss": _mean_loss(coarse_gen, GalerkinLoss(coarse, fine), params),
            "new_level_loss": _mean_loss(fine_gen, fine, params),
            "last_logged_loss": next(r["loss"] for r in reversed(records) if r["step"] <= old.end),
            "first_logged_loss": next(r["loss"] for r in records if r["step"] > old.end),
        })
    print(json.dumps({"run_dir": str(args.run_dir), "coarse_loss_setting": cfg.multigrid.coarse_loss,
                      "output": cfg.model.output, "changes": changes}, indent=2))


if __name__ == "__main__":
    main()
