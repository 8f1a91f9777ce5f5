"""Architectures no library provides, a backbone registry, and offline loaders for shipped models.

Task modules name their network with a string: :func:`build_backbone` returns a
feature extractor (input -> ``(B, F)``, no classification head) with a
``num_features`` attribute, so a task module only adds its head:

- our own backbones, listed in :data:`BACKBONES` (CIFAR ResNets, small nets for the
  embedded data);
- any other name goes to ``timm.create_model(name, num_classes=0, ...)``.

Weights come only from a local file (``pretrained_path``): nothing here reaches a hub.

.. code-block:: python

    from lit_lowrank.models import build_backbone

    backbone = build_backbone("resnet20_cifar", in_chans=1)            # ours
    backbone = build_backbone("resnet18", pretrained_path="r18.pth")   # timm + local weights
    head = nn.Linear(backbone.num_features, num_classes)

To add a backbone: write a builder ``fn(in_chans=3, **kwargs) -> nn.Module`` that sets
``num_features``, and add one line to :data:`BACKBONES`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from torch import nn

from lit_lowrank.models.castor import Castor
from lit_lowrank.models.cross_dataset import CrossDatasetDigitClassifier
from lit_lowrank.models.graph_baselines import (
    ACMGCN,
    GPRGNN,
    APPNPNet,
    BernNet,
    ChebNet,
    ChebNetII,
    FAGCNNet,
    GCNIINet,
    MixHopNet,
    SGCNet,
)
from lit_lowrank.models.pretrained import (
    encode_sentences,
    load_minilm,
    load_smollm2,
    load_smollm2_tokenizer,
    minilm_path,
    smollm2_path,
)
from lit_lowrank.models.prototype import DigitPrototypeClassifier, PrototypeClassifier, digit_view
from lit_lowrank.models.resnet_cifar import (
    ResNetCifar,
    resnet20_cifar,
    resnet32_cifar,
    resnet56_cifar,
    resnet110_cifar,
)
from lit_lowrank.models.sentence_encoder import minilm as _minilm
from lit_lowrank.models.small import MLP, SmallCNN, TokenBagEncoder, cnn_small, mlp, token_bag
from lit_lowrank.models.zero_shot_clip import ZeroShotCLIP

# The names imported from lit_lowrank.models.* above and defined below, once, sorted; a literal so that
# ruff and IDEs read it (tests/test_exports.py checks).
__all__ = [
    "ACMGCN", "APPNPNet", "BACKBONES", "BernNet", "Castor", "ChebNet", "ChebNetII", "CrossDatasetDigitClassifier",
    "DigitPrototypeClassifier", "FAGCNNet", "GCNIINet", "GPRGNN", "GRAPH_MODELS", "MLP", "MixHopNet",
    "PrototypeClassifier", "ResNetCifar", "SGCNet", "SmallCNN", "TokenBagEncoder", "ZeroShotCLIP", "build_backbone",
    "cnn_small", "digit_view", "encode_sentences", "load_minilm", "load_smollm2", "load_smollm2_tokenizer",
    "minilm_path", "mlp", "resnet110_cifar", "resnet20_cifar", "resnet32_cifar", "resnet56_cifar", "smollm2_path",
    "token_bag",
]

#: Our node-classification models by lower-case name (``NodeClassificationModule(model="castor")``).
GRAPH_MODELS: dict[str, type[nn.Module]] = {
    "castor": Castor, "gprgnn": GPRGNN, "bernnet": BernNet, "chebnetii": ChebNetII, "acmgcn": ACMGCN,
    "appnp": APPNPNet, "sgc": SGCNet, "chebnet": ChebNet, "gcnii": GCNIINet, "fagcn": FAGCNNet, "mixhop": MixHopNet,
}

def _mc_lm(in_chans: int = 3, **kwargs: Any) -> nn.Module:
    from lit_lowrank.models.mc_lm import mc_lm  # transformers is imported only when this backbone is built

    return mc_lm(in_chans, **kwargs)


#: Our own backbones: name -> builder returning a feature extractor with ``num_features``.
BACKBONES: dict[str, Callable[..., nn.Module]] = {
    "resnet20_cifar": resnet20_cifar,
    "resnet32_cifar": resnet32_cifar,
    "resnet56_cifar": resnet56_cifar,
    "resnet110_cifar": resnet110_cifar,
    "mlp": mlp,
    "cnn_small": cnn_small,
    "token_bag": token_bag,
    "minilm": _minilm,  # the offline pretrained sentence encoder (token ids -> 384 features)
    "mc_lm": _mc_lm,  # a causal LM scoring multiple-choice prompts (models/mc_lm.py; head over the options)
}


def build_backbone(name: str, in_chans: int = 3, pretrained_path: str | None = None, **kwargs: Any) -> nn.Module:
    """Build a feature extractor by name: one of :data:`BACKBONES`, else a timm model.

    Args:
        name: a key of :data:`BACKBONES` or any ``timm.list_models()`` name (a pretrained
            tag such as ``"resnet18.a1_in1k"`` is accepted but only selects the config;
            weights come from ``pretrained_path``).
        in_chans: input image channels. Passed to builders that take it; ``mlp`` and
            ``token_bag`` read ``in_features`` / ``vocab_size`` instead and ignore it.
        pretrained_path: a local weights file (``.safetensors``, ``.pt``, ``.pth``; a plain
            state dict, or a checkpoint dict holding one under ``state_dict``/``model``).
            For timm models the classifier keys are dropped and a stem trained on a
            different channel count is adapted to ``in_chans`` (timm's
            ``adapt_input_conv``); every other key must match exactly.
        **kwargs: passed to the builder (ours) or to ``timm.create_model``.

    Returns:
        An ``nn.Module`` mapping the input to ``(B, num_features)``, with ``num_features``.

    Raises:
        ValueError: ``name`` is neither ours nor a timm model.
        FileNotFoundError: ``pretrained_path`` does not exist.
        RuntimeError: the file's keys or shapes do not match the backbone.

    .. code-block:: python

        net = build_backbone("cnn_small", in_chans=1)
        net = build_backbone("test_resnet", in_chans=1, pretrained_path="weights.safetensors")
        features = net(torch.randn(4, 1, 28, 28))    # (4, net.num_features)
    """
    if pretrained_path is not None and not os.path.isfile(pretrained_path):
        raise FileNotFoundError(
            f"pretrained_path={pretrained_path!r}: no such file (expected a local .safetensors/.pt/.pth)."
        )
    if name in BACKBONES:
        builder = BACKBONES[name]
        if "in_chans" in inspect.signature(builder).parameters:
            kwargs["in_chans"] = in_chans
        model = builder(**kwargs)
        classifier_keys: tuple[str, ...] = ()
        first_conv = None
    else:
        import timm  # imported here: timm pulls in torchvision (~3 s) and only this path needs it

        if not timm.is_model(name):
            raise ValueError(
                f"backbone={name!r} is neither one of ours ({', '.join(BACKBONES)}) nor a timm model. "
                f"List timm's names with e.g. timm.list_models('*resnet*')."
            )
        model = timm.create_model(name, num_classes=0, in_chans=in_chans, pretrained=False, **kwargs)
        classifier = model.pretrained_cfg.get("classifier") or ()
        classifier_keys = (classifier,) if isinstance(classifier, str) else tuple(classifier)
        first_conv = model.pretrained_cfg.get("first_conv")
    if pretrained_path is not None:
        _load_local_weights(model, pretrained_path, in_chans, classifier_keys, first_conv)
    return model


def _load_local_weights(
    model: nn.Module,
    path: str,
    in_chans: int,
    classifier_keys: tuple[str, ...],
    first_conv: str | tuple[str, ...] | None,
) -> None:
    """Load ``path`` into ``model`` strictly, after dropping classifier keys and adapting the stem."""
    from timm.models import adapt_input_conv, load_state_dict

    # timm's reader handles safetensors and torch files (weights_only), unwraps
    # checkpoint dicts and strips DDP/compile prefixes.
    state_dict = load_state_dict(path)
    for prefix in classifier_keys:
        state_dict.pop(f"{prefix}.weight", None)
        state_dict.pop(f"{prefix}.bias", None)
    first_convs = (first_conv,) if isinstance(first_conv, str) else tuple(first_conv or ())
    for conv in first_convs:
        weight = state_dict.get(f"{conv}.weight")
        if weight is not None and weight.dim() == 4 and weight.shape[1] != in_chans:
            state_dict[f"{conv}.weight"] = adapt_input_conv(in_chans, weight, base_chans=weight.shape[1])
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as error:
        raise RuntimeError(f"pretrained_path={path!r} does not match the backbone: {error}") from error
