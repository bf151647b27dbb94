"""The one compiled part of ckptio: ``ckptio._memcopy`` (see ckptio/_memcopy.c). Optional:
without a C compiler the install goes on and copies use numpy (``ckptio.arrays.copy_into``).
Everything else is configured in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ckptio._memcopy", ["ckptio/_memcopy.c"], optional=True)])
