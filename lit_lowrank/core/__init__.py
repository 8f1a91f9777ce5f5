"""The small shared machinery: loss hooks, surgery helpers, registry, logging."""

from lit_lowrank.core.logging import log_method, method_key
from lit_lowrank.core.loss_hooks import (
    OUTPUT_KEYS,
    LossHookWarning,
    MethodCallback,
    apply_loss_hooks,
    method_callbacks,
    require_outputs,
)
from lit_lowrank.core.registry import (
    MethodSpec,
    all_methods,
    get_method,
    implemented_methods,
    methods_table,
    register_method,
    unregister_method,
)
from lit_lowrank.core.surgery import (
    find_modules,
    import_object,
    is_replaced,
    mark_replaced,
    rebuild_surgery,
    record_surgery,
    replace_module,
    save_surgery,
    surgery_records,
)
from lit_lowrank.core.temporary import temporarily_set

__all__ = [
    "MethodCallback", "apply_loss_hooks", "method_callbacks", "require_outputs", "OUTPUT_KEYS", "log_method", "method_key",
    "MethodSpec", "register_method", "unregister_method", "get_method", "all_methods", "implemented_methods",
    "methods_table", "find_modules", "replace_module", "mark_replaced", "is_replaced", "record_surgery",
    "surgery_records", "save_surgery", "rebuild_surgery", "import_object",
    "temporarily_set", "LossHookWarning",
]
