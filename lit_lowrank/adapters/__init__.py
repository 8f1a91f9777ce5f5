"""Adapter injectors: PEFT-compatible LoRA variants and the AdapterInjector callback (see DESIGN.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.adapters.diagnostics import AdapterDiagnostics  # noqa: F401
    from lit_lowrank.adapters.injector import (  # noqa: F401
        AdapterInjector,
        adapter_layers,
        adapter_method,
        inject_adapters,
        merge_adapters,
        named_adapter_layers,
        peft_config_for,
    )
    from lit_lowrank.adapters.polar import PoLARLandingWarning, PoLARLinear, polar_delta_stable_rank, polar_layers  # noqa: F401
    from lit_lowrank.adapters.polar_landing import PoLARLanding, apply_landing_, polar_diagnostics, stiefel_factors  # noqa: F401
    from lit_lowrank.adapters.polar_vbll import AlternatingSchedule, PoLARVBLL, apply_polar_vbll  # noqa: F401
    from lit_lowrank.adapters.portable import (  # noqa: F401
        load_adapters,
        load_peft_model,
        read_variant_info,
        save_adapters,
        write_variant_info,
    )
    from lit_lowrank.adapters.sama import SaMALinear  # noqa: F401
    from lit_lowrank.adapters.sd_lora import SDLoRA  # noqa: F401
    from lit_lowrank.adapters.sds_lora import SDSLoraLinear  # noqa: F401
    from lit_lowrank.adapters.variants import available_variants, get_variant, register_variant, unregister_variant  # noqa: F401

_EXPORTS = {
    'AdapterDiagnostics': 'lit_lowrank.adapters.diagnostics',
    'AdapterInjector': 'lit_lowrank.adapters.injector',
    'adapter_layers': 'lit_lowrank.adapters.injector',
    'adapter_method': 'lit_lowrank.adapters.injector',
    'inject_adapters': 'lit_lowrank.adapters.injector',
    'load_adapters': 'lit_lowrank.adapters.portable',
    'load_peft_model': 'lit_lowrank.adapters.portable',
    'merge_adapters': 'lit_lowrank.adapters.injector',
    'named_adapter_layers': 'lit_lowrank.adapters.injector',
    'peft_config_for': 'lit_lowrank.adapters.injector',
    'read_variant_info': 'lit_lowrank.adapters.portable',
    'save_adapters': 'lit_lowrank.adapters.portable',
    'write_variant_info': 'lit_lowrank.adapters.portable',
    'PoLARLandingWarning': 'lit_lowrank.adapters.polar',
    'PoLARLinear': 'lit_lowrank.adapters.polar',
    'polar_delta_stable_rank': 'lit_lowrank.adapters.polar',
    'polar_layers': 'lit_lowrank.adapters.polar',
    'PoLARLanding': 'lit_lowrank.adapters.polar_landing',
    'apply_landing_': 'lit_lowrank.adapters.polar_landing',
    'polar_diagnostics': 'lit_lowrank.adapters.polar_landing',
    'stiefel_factors': 'lit_lowrank.adapters.polar_landing',
    'AlternatingSchedule': 'lit_lowrank.adapters.polar_vbll',
    'PoLARVBLL': 'lit_lowrank.adapters.polar_vbll',
    'apply_polar_vbll': 'lit_lowrank.adapters.polar_vbll',
    'SaMALinear': 'lit_lowrank.adapters.sama',
    'SDLoRA': 'lit_lowrank.adapters.sd_lora',
    'SDSLoraLinear': 'lit_lowrank.adapters.sds_lora',
    'available_variants': 'lit_lowrank.adapters.variants',
    'get_variant': 'lit_lowrank.adapters.variants',
    'register_variant': 'lit_lowrank.adapters.variants',
    'unregister_variant': 'lit_lowrank.adapters.variants',
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
