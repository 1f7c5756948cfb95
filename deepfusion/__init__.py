"""DeepFusion: data-parallel training of DiffNet generators on CPU clusters (MPI + threads), and the
trained generators as Python callables (:class:`Surrogate`)."""

from deepfusion.configuration.inputs import InputError, ParameterRangeWarning
from deepfusion.family import load_family
from deepfusion.surrogate import Surrogate

__all__ = ["Surrogate", "load_family", "InputError", "ParameterRangeWarning", "__version__"]

__version__ = "0.1.0"
