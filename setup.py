"""The one compiled piece: localspec.llama._hostloop, optional (pyproject.toml holds the rest).
Where it cannot be built (no C compiler or Python headers), the install goes on and
localspec.llama.hostloop runs the same steps in numpy."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("localspec.llama._hostloop", ["localspec/llama/_hostloop.c"],
                             extra_compile_args=["-O2"], optional=True)])
