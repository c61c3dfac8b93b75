"""cumatrix: run native CUDA code across runtimes x drivers x build headers."""

__version__ = "0.1.0"
