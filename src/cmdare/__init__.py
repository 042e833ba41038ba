"""cmdare: training on transient cloud GPU servers (CM-DARE and PSLD on Ray)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
