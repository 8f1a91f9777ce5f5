"""The small shared machinery: loss hooks, surgery helpers, registry, logging.

Names are imported on first use, so ``lit_lowrank.core.registry`` (read by
``lit-lowrank methods``) does not pay Lightning's import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.core.figures import log_figure  # noqa: F401
    from lit_lowrank.core.logging import log_method, method_key  # noqa: F401
    from lit_lowrank.core.loss_hooks import (  # noqa: F401
        OUTPUT_KEYS,
        LossHookWarning,
        MethodCallback,
        apply_loss_hooks,
        method_callbacks,
        require_outputs,
    )
    from lit_lowrank.core.method_entry import log_method_entry, method_config  # noqa: F401
    from lit_lowrank.core.module_methods import (  # noqa: F401
        ModuleMethod,
        apply_module_method,
        log_module_methods,
        method_aux_loss,
        method_context,
        register_module_method,
    )
    from lit_lowrank.core.registry import (  # noqa: F401
        MethodSpec,
        all_methods,
        get_method,
        implemented_methods,
        methods_table,
        register_method,
        unregister_method,
    )
    from lit_lowrank.core.surgery import (  # noqa: F401
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
    from lit_lowrank.core.temporary import temporarily_set  # noqa: F401

_EXPORTS = {
    "log_figure": "figures", "method_config": "method_entry", "log_method_entry": "method_entry",
    "log_method": "logging", "method_key": "logging",
    "OUTPUT_KEYS": "loss_hooks", "LossHookWarning": "loss_hooks", "MethodCallback": "loss_hooks", "apply_loss_hooks": "loss_hooks",
    "method_callbacks": "loss_hooks", "require_outputs": "loss_hooks",
    "MethodSpec": "registry", "all_methods": "registry", "get_method": "registry",
    "implemented_methods": "registry", "methods_table": "registry", "register_method": "registry",
    "unregister_method": "registry",
    "find_modules": "surgery", "import_object": "surgery", "is_replaced": "surgery", "mark_replaced": "surgery",
    "rebuild_surgery": "surgery", "record_surgery": "surgery", "replace_module": "surgery",
    "save_surgery": "surgery", "surgery_records": "surgery",
    "temporarily_set": "temporary",
    "ModuleMethod": "module_methods", "apply_module_method": "module_methods", "log_module_methods": "module_methods",
    "method_aux_loss": "module_methods", "method_context": "module_methods",
    "register_module_method": "module_methods",
}

__all__ = sorted(_EXPORTS)


from lit_lowrank.core import quiet as _quiet  # noqa: E402  (cheap: the logging module only)

_quiet.install()

__getattr__, __dir__ = lazy_exports(__name__, {k: f"{__name__}.{v}" for k, v in _EXPORTS.items()}, globals())
