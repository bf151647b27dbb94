"""Storage backends, one module each; installed as ``ckptio.backends.<name>``.

The core never imports these directly: it finds them through the ``ckptio.backends``
entry-point group (see :mod:`ckptio.registry`).
"""

__all__: list[str] = []
