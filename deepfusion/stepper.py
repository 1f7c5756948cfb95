"""The documented path ``deepfusion.stepper``, kept working: the module is :mod:`deepfusion.training.stepper`
(this name is that module, not a copy)."""

import sys

from deepfusion.training import stepper as _module

sys.modules[__name__] = _module
