"""The documented path ``deepfusion.comm``, kept working: the module is :mod:`deepfusion.parallel.comm`
(this name is that module, not a copy)."""

import sys

from deepfusion.parallel import comm as _module

sys.modules[__name__] = _module
