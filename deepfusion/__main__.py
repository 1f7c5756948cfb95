"""``python -m deepfusion``: the same entry point as the ``deepfusion`` command."""

from deepfusion.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
