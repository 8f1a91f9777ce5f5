"""CAMELModule: concept sampling, the two training phases, trust region, logged artefacts."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lit_lowrank.tasks.camel import CAMELModule
from lit_lowrank.tasks.diffusion import DiffusionModule

TINY = {"sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1,
        "block_out_channels": (8, 16), "down_block_types": ("DownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "UpBlock2D"), "norm_num_groups": 4}


def _module(**kwargs):
    torch.manual_seed(0)
    defaults = dict(unet_config=TINY, num_classes=10, concept_classes=[1, 7], num_train_seeds=4,
                    num_heldout_seeds=4, num_eval_seeds=4, num_inference_steps=3, warmup_steps=2)
    defaults.update(kwargs)
    return CAMELModule(**defaults)


def test_generate_is_deterministic_and_differentiable_in_the_concept():
    model = _module()
    model.start_concepts()
    z = model.concepts.detach().clone().requires_grad_(True)
    a = model.generate(z, model.train_noise)
    b = model.generate(z.detach(), model.train_noise)
    assert a.shape == (2, 4, 1, 8, 8)
    assert torch.equal(a.detach(), b)
    a.pow(2).sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.creator.parameters())  # the Creator stays frozen
    # the vanilla concept (z = e_c) reproduces the Creator's own DDIM sampler for class c
    vanilla = model.creator.sample(4, class_labels=torch.full((4,), 7), num_inference_steps=3, noise=model.train_noise)
    torch.testing.assert_close(b[1], vanilla, atol=1e-5, rtol=1e-4)


class _LabelDenoiser(torch.nn.Module):
    """A non-diffusers denoiser whose class table is not called ``class_embedding``."""

    sample_shape = (1, 8, 8)

    def __init__(self, extra_table: bool = False) -> None:
        super().__init__()
        self.labels = torch.nn.Embedding(10, 4)
        self.time = torch.nn.Embedding(1000, 4)  # a second table, with another row count
        self.proj = torch.nn.Linear(4, 64)
        if extra_table:
            self.other = torch.nn.Embedding(10, 4)

    def forward(self, x, t, class_labels=None):
        return x * 0.5 + self.proj(self.labels(class_labels) + self.time(t)).view_as(x)


def test_generate_works_with_any_denoiser_whose_class_table_is_found_or_named():
    from lit_lowrank.tasks.camel import find_class_table

    torch.manual_seed(0)
    creator = DiffusionModule(model=_LabelDenoiser(), num_classes=10)
    model = CAMELModule(creator=creator, concept_classes=[2, 5], num_train_seeds=3, num_heldout_seeds=3,
                        num_eval_seeds=3, num_inference_steps=3)
    assert model.class_table_name == "labels" and model.num_classes == 10
    model.start_concepts()
    torch.testing.assert_close(model.anchors, creator.model.labels.weight[[2, 5]])
    samples = model.generate(model.concepts.detach(), model.train_noise)
    vanilla = creator.sample(3, class_labels=torch.full((3,), 5), num_inference_steps=3, noise=model.train_noise)
    torch.testing.assert_close(samples[1], vanilla, atol=1e-5, rtol=1e-4)
    two = _LabelDenoiser(extra_table=True)
    with pytest.raises(ValueError, match="class_embedding"):
        find_class_table(two, num_classes=10)  # two 10-row tables: ambiguous
    assert find_class_table(two, "other", 10) == "other"
    with pytest.raises(ValueError, match="`class_embedding`='proj'"):
        find_class_table(two, "proj", 10)


def test_fit_warms_up_then_moves_concepts_within_the_trust_region(tmp_path):
    from lit_lowrank.datamodules import DigitsDataModule

    model = _module(max_shift=0.5, concept_lr=0.5)
    logger = CSVLogger(tmp_path, name="camel")
    trainer = pl.Trainer(max_steps=4, limit_val_batches=1, val_check_interval=4, logger=logger,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))
    assert bool(model.initialised)
    shift = (model.concepts - model.anchors).norm(dim=1) / model.anchors.norm(dim=1)
    assert (shift > 0).all() and (shift <= 0.5 + 1e-5).all()
    torch.testing.assert_close(model.anchors, model.creator.model.class_embedding.weight[[1, 7]])
    metrics = trainer.callback_metrics
    assert {"val/reward", "val/l0", "val/lk", "method/camel/reward", "train/creator_loss"} <= set(metrics)
    log_dir = tmp_path / "camel" / "version_0"
    assert list((log_dir / "images").glob("method_camel_concepts_step*.png"))  # core/figures.log_figure
    saved = torch.load(log_dir / "camel_concepts.pt")
    torch.testing.assert_close(saved["concepts"], model.concepts.detach())


@pytest.mark.parametrize("objective", ["camel", "novelty", "familiarity"])
def test_outer_loss_follows_the_objective(objective):
    model = _module(objective=objective)
    terms = {"reward": torch.tensor([1.0, 3.0]), "l0": torch.tensor([4.0, 6.0]), "lk": torch.tensor([3.0, 3.0])}
    expected = {"camel": -2.0, "novelty": -5.0, "familiarity": 5.0}[objective]
    assert model.outer_loss(terms).item() == expected


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="objective"):
        _module(objective="fun")
    with pytest.raises(ValueError, match="concept_classes"):
        _module(concept_classes=[12])
    with pytest.raises(ValueError, match="class_embedding"):
        CAMELModule(creator=DiffusionModule(unet_config=TINY), warmup_steps=1)
    with pytest.raises(FileNotFoundError, match="creator_checkpoint"):
        _module(creator_checkpoint="/nonexistent.ckpt")


def _write_idx(path, array, magic):
    import numpy as np

    header = np.array([magic, *array.shape], dtype=">i4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_mnist_datamodule_reads_a_local_torchvision_root_and_names_a_missing_one(tmp_path):
    import numpy as np

    from lit_lowrank.datamodules import MNISTDataModule

    with pytest.raises(FileNotFoundError, match="MNIST not found"):
        MNISTDataModule(root=str(tmp_path / "absent")).setup("fit")
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 20)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), 2051)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, 2049)
    dm = MNISTDataModule(root=str(tmp_path), batch_size=8, normalize=False)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (8, 1, 28, 28) and 0 <= batch["x"].min() and batch["x"].max() <= 1
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 60


def _clip_module(**kwargs):
    from lit_lowrank.models.clip_appraiser import CLIPAppraiser
    from tests.models.test_clip_appraiser import _prompts, _tiny_clip

    appraiser = CLIPAppraiser(_tiny_clip(), _prompts(10), rank=2, alpha=4.0)
    return _module(appraiser=appraiser, **kwargs)


def test_clip_appraiser_adapts_only_its_adapter_and_passes_gradient_to_the_concepts():
    model = _clip_module()
    assert model.appraiser_kind == "clip"
    model.start_concepts()
    before = {k: v.clone() for k, v in model.appraiser.state_dict().items()}
    terms = model.objective_terms(model.concepts, model.train_noise, model.heldout_noise)
    assert terms["reward"].shape == (2,) and torch.isfinite(terms["reward"]).all()
    model.outer_loss(terms).backward()
    assert model.concepts.grad is not None and torch.isfinite(model.concepts.grad).all()
    assert model.concepts.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.appraiser.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.appraiser.state_dict().items())
    # the frozen pretrained CLIP never joins the optimizer (its adapter is only adapted functionally)
    groups = model.configure_optimizers().param_groups
    appraiser_ids = {id(p) for p in model.appraiser.parameters()}
    assert not any(id(p) in appraiser_ids for g in groups for p in g["params"])


def test_clip_appraiser_fits_through_the_warm_up_and_concept_phases():
    from lit_lowrank.datamodules import DigitsDataModule

    model = _clip_module(warmup_steps=1, concept_lr=0.5)
    trainer = pl.Trainer(max_steps=2, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=16))
    assert bool(model.initialised)
    assert not torch.equal(model.concepts, model.anchors)


def test_clip_appraiser_by_name_needs_a_local_clip_path(tmp_path):
    from tests.models.test_clip_appraiser import _save_tiny_clip

    names = [str(i) for i in range(10)]
    with pytest.raises(ValueError, match="clip_path"):
        _module(appraiser="clip", clip_class_names=names)
    with pytest.raises(FileNotFoundError, match="clip_path"):
        _module(appraiser="clip", clip_path=str(tmp_path / "absent"), clip_class_names=names)
    with pytest.raises(ValueError, match="clip_class_names"):
        _module(appraiser="clip", clip_path=str(tmp_path), clip_class_names=["cat", "dog"])
    with pytest.raises(ValueError, match="appraiser"):
        _module(appraiser="vae")
    _save_tiny_clip(tmp_path)
    model = _module(appraiser="clip", clip_path=str(tmp_path), clip_class_names=["cat"] * 5 + ["dog"] * 5,
                    clip_prompt_template="a photo of {} .", clip_rank=2)
    assert model.appraiser_kind == "clip" and model.hparams["appraiser"] == "clip"
    assert len(model.appraiser.adapter_params()) == 2
    # what load_from_checkpoint does: rebuild from the saved hyperparameters, then load the state strictly
    rebuilt = CAMELModule(**model.hparams)
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt.appraiser_kind == "clip"


def test_recognition_guard_enters_every_objective_and_needs_a_recognizer():
    from torch import nn

    recognizer = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    model = _module(recognizer=recognizer, recognition_weight=2.0, recognition_margin=5.0)
    model.start_concepts()
    terms = model.objective_terms(model.concepts, model.train_noise, model.heldout_noise)
    assert terms["recognition"].shape == (2,) and (terms["recognition"] > 0).all()
    for objective in ("camel", "novelty", "familiarity"):
        model.objective = objective
        unguarded = {"camel": -terms["reward"], "novelty": -terms["l0"], "familiarity": terms["l0"]}[objective]
        torch.testing.assert_close(model.outer_loss(terms), unguarded.mean() + 2.0 * terms["recognition"].mean())
    model.outer_loss(terms).backward()
    assert model.concepts.grad is not None and all(p.grad is None for p in recognizer.parameters())
    assert not any(p.requires_grad for p in recognizer.parameters())
    with pytest.raises(ValueError, match="recognizer"):
        _module(recognition_weight=1.0)
    with pytest.raises(ValueError, match="clip_loss"):
        _module(clip_loss="contrastive")


def test_clip_appraiser_guard_uses_clips_own_zero_shot_logits():
    model = _clip_module(recognition_weight=1.0, recognition_margin=100.0)
    assert model.hparams.clip_loss == "alignment"
    model.start_concepts()
    terms = model.objective_terms(model.concepts, model.train_noise, model.heldout_noise)
    assert (terms["recognition"] > 0).all()
    model.outer_loss(terms).backward()
    assert torch.isfinite(model.concepts.grad).all() and model.concepts.grad.abs().sum() > 0
