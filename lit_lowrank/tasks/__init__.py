"""Shared LightningModules for the task families; methods never copy them to change them."""

from lit_lowrank.tasks.base import TaskModule
from lit_lowrank.tasks.camel import CAMELModule
from lit_lowrank.tasks.classification import ClassificationModule
from lit_lowrank.tasks.diffusion import DiffusionModule
from lit_lowrank.tasks.fb import FBModule
from lit_lowrank.tasks.fewshot_clip import FewShotCLIPClassifier, FewShotCLIPModule
from lit_lowrank.tasks.graph import NodeClassificationModule, build_graph_model
from lit_lowrank.tasks.grpo import GRPOModule
from lit_lowrank.tasks.language_model import CausalLMModule, block_causal_attention_mask
from lit_lowrank.tasks.tomography import TomographyModule

__all__ = [
    "TaskModule", "ClassificationModule", "CausalLMModule", "NodeClassificationModule", "DiffusionModule",
    "build_graph_model", "block_causal_attention_mask", "GRPOModule", "TomographyModule", "CAMELModule",
    "FewShotCLIPModule", "FewShotCLIPClassifier", "FBModule",
]
