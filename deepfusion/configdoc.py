"""The documented command ``python -m deepfusion.configdoc``, kept working: the module is
:mod:`deepfusion.configuration.configdoc`."""

from deepfusion.configuration.configdoc import markdown

__all__ = ["markdown"]

if __name__ == "__main__":
    print(markdown(), end="")
