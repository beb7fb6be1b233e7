"""What every layer shares. The package's version lives here, in the layer everything may import
(``localspec.__version__`` re-exports it; pyproject.toml's ``version`` must match)."""

__version__ = "0.1.0"
