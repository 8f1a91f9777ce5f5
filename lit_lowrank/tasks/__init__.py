"""Shared LightningModules for the task families; methods never copy them to change them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.tasks.base import TaskModule  # noqa: F401
    from lit_lowrank.tasks.camel import CAMELModule  # noqa: F401
    from lit_lowrank.tasks.classification import ClassificationModule  # noqa: F401
    from lit_lowrank.tasks.diffusion import DiffusionModule  # noqa: F401
    from lit_lowrank.tasks.fb import FBModule  # noqa: F401
    from lit_lowrank.tasks.fewshot_clip import FewShotCLIPClassifier, FewShotCLIPModule  # noqa: F401
    from lit_lowrank.tasks.graph import NodeClassificationModule, build_graph_model  # noqa: F401
    from lit_lowrank.tasks.grpo import GRPOModule  # noqa: F401
    from lit_lowrank.tasks.language_model import CausalLMModule, block_causal_attention_mask  # noqa: F401
    from lit_lowrank.tasks.tomography import TomographyModule  # noqa: F401

_EXPORTS = {
    'TaskModule': 'lit_lowrank.tasks.base',
    'CAMELModule': 'lit_lowrank.tasks.camel',
    'ClassificationModule': 'lit_lowrank.tasks.classification',
    'DiffusionModule': 'lit_lowrank.tasks.diffusion',
    'FBModule': 'lit_lowrank.tasks.fb',
    'FewShotCLIPClassifier': 'lit_lowrank.tasks.fewshot_clip',
    'FewShotCLIPModule': 'lit_lowrank.tasks.fewshot_clip',
    'NodeClassificationModule': 'lit_lowrank.tasks.graph',
    'build_graph_model': 'lit_lowrank.tasks.graph',
    'GRPOModule': 'lit_lowrank.tasks.grpo',
    'CausalLMModule': 'lit_lowrank.tasks.language_model',
    'block_causal_attention_mask': 'lit_lowrank.tasks.language_model',
    'TomographyModule': 'lit_lowrank.tasks.tomography',
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
