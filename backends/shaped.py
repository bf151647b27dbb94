"""The earlier name of :mod:`ckptio.backends.emulate`: ``ShapedStore`` is
:class:`~ckptio.backends.emulate.EmulatedStore` (and ``shaped+<url>`` still opens one, an
alias in the registry)."""

from .emulate import EmulatedStore as ShapedStore

__all__ = ["ShapedStore"]
