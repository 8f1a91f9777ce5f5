"""Methods that act from outside a module (one file each). Filled by the method issues."""

from lit_lowrank.core.loss_hooks import MethodCallback

__all__ = ["MethodCallback"]
