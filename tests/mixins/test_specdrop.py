"""SpecDrop as a mixin: the branch block, its merge rules, the category context, surgery and
checkpoint reload, the learned-router baselines' aux loss, and the sensitivity analysis."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader

from lit_lowrank.core import surgery_records
from lit_lowrank.core.surgery import SURGERY_CHECKPOINT_KEY
from lit_lowrank.mixins import (
    SpecDropBranches,
    SpecDropSensitivity,
    ablate_branch,
    apply_specdrop,
    specdrop_aux_loss,
    specdrop_blocks,
    specdrop_category,
)
from lit_lowrank.ops.specdrop import specdrop_merge
from lit_lowrank.tasks import ClassificationModule
from tests.mixins.plain import PlainSpecDropClassifier


def _mlp(d: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, d))


def test_block_specdrop_equals_the_op():
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 3, p_active=1.0, p_inactive=0.2)
    x, category = torch.randn(5, 8), torch.tensor([0, 1, 2, 2, 0])
    with specdrop_category(block, category):
        y = block(x)
    torch.testing.assert_close(y, specdrop_merge([b(x) for b in block.branches], category, 1.0, 0.2))
    assert block.category is None  # the context never leaks into a later forward


def test_block_equal_weights_is_no_routing_exactly():
    torch.manual_seed(0)
    spec = SpecDropBranches(_mlp(), 4, p_active=0.5, p_inactive=0.5)
    none = SpecDropBranches(_mlp(), 4, merge="no_routing")
    none.load_state_dict(spec.state_dict())
    x = torch.randn(6, 8)
    with specdrop_category(spec, torch.tensor([0, 1, 2, 3, 0, 1])):
        assert torch.equal(spec(x), none(x))


def test_branch_copies_are_fresh_draws_or_copies():
    torch.manual_seed(0)
    permuted = SpecDropBranches(_mlp(), 3)  # default init="permute"
    w = [b[0].weight for b in permuted.branches]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    assert all(torch.equal(w[0].flatten().sort().values, v.flatten().sort().values) for v in w)  # same entries
    reset = SpecDropBranches(_mlp(), 3, init="reset")
    assert not torch.equal(reset.branches[0][0].weight, reset.branches[1][0].weight)
    copied = SpecDropBranches(_mlp(), 3, init="copy")
    assert all(torch.equal(copied.branches[0][0].weight, b[0].weight) for b in copied.branches)


def test_missing_tag_raises_in_training_and_tag_free_inference_is_uniform():
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 3, missing_category="uniform")
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="no category tag"):
        block(x)  # training mode: always an error
    block.eval()
    torch.testing.assert_close(block(x), torch.stack([b(x) for b in block.branches]).mean(0))
    strict = SpecDropBranches(_mlp(), 3).eval()
    with pytest.raises(ValueError, match="missing_category='uniform'"):
        strict(x)


def test_out_of_range_tag_and_wrong_shape_raise():
    block = SpecDropBranches(_mlp(), 3)
    with specdrop_category(block, torch.tensor([0, 3])), pytest.raises(ValueError, match=r"expected tags in \[0, 3\)"):
        block(torch.randn(2, 8))
    with specdrop_category(block, torch.tensor([0, 1, 2])), pytest.raises(ValueError, match="do not match"):
        block(torch.randn(2, 8))


def test_category_map_for_more_categories_than_branches():
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 2, category_to_branch=[0, 0, 1, 1, 1])
    x = torch.randn(3, 8)
    with specdrop_category(block, torch.tensor([1, 4, 0])):
        y = block(x)
    torch.testing.assert_close(y, specdrop_merge([b(x) for b in block.branches], torch.tensor([0, 1, 0]), 1.0, 0.1))
    with specdrop_category(block, torch.tensor([5, 0, 0])), pytest.raises(ValueError, match="maps only 5"):
        block(x)


@pytest.mark.parametrize("merge", ["no_routing", "shared_expert", "router", "soft_moe"])
@pytest.mark.parametrize("shape", [(5, 8), (5, 3, 8)])
def test_baselines_run_and_only_routers_have_aux_loss(merge, shape):
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 4, merge=merge, router_top_k=2)
    y = block(torch.randn(*shape))
    assert y.shape == shape
    y.sum().backward()
    assert (block.aux_loss is not None) == (merge == "router")
    torch.testing.assert_close(block.last_stats["branch_weight"].sum(), torch.tensor(1.0))
    if merge == "shared_expert":
        torch.testing.assert_close(block.last_stats["branch_weight"], torch.tensor([0.5, 1 / 6, 1 / 6, 1 / 6]))


def test_router_on_conv_stage_and_soft_moe_needs_tokens():
    block = SpecDropBranches(nn.Conv2d(4, 4, 3, padding=1), 2, merge="router")
    assert block(torch.randn(2, 4, 5, 5)).shape == (2, 4, 5, 5)
    soft = SpecDropBranches(nn.Conv2d(4, 4, 3, padding=1), 2, merge="soft_moe")
    with pytest.raises(ValueError, match="soft_moe"):
        soft(torch.randn(2, 4, 5, 5))


def test_lora_branches_start_at_the_frozen_base():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(3, 8)
    before = model(x)
    apply_specdrop(model, target=["0"], num_branches=3, branch_type="lora", lora_rank=2, freeze_others=True)
    with specdrop_category(model, torch.tensor([0, 1, 2])):
        torch.testing.assert_close(model(x), before)  # lora_B starts at zero
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"0.branches.{k}.lora_{m}.weight" for k in range(3) for m in "AB"}


def test_apply_is_idempotent_recorded_and_checked():
    torch.manual_seed(0)
    model = nn.Sequential(_mlp(), nn.Linear(8, 2))
    apply_specdrop(model, target=r"^0$", num_branches=3)
    keys = list(model.state_dict())
    apply_specdrop(model, target=r"^0$", num_branches=3)
    assert list(model.state_dict()) == keys and len(specdrop_blocks(model)) == 1
    assert surgery_records(model) == [{"method": "specdrop", "apply_fn": "lit_lowrank.mixins.specdrop.apply_specdrop",
                                       "kwargs": {"target": "^0$", "num_branches": 3, "merge": "specdrop",
                                                  "freeze_others": False}}]
    with pytest.raises(ValueError, match="already wrapped"):
        apply_specdrop(model, target=r"^0$", num_branches=4)
    with pytest.raises(ValueError, match="matches no module"):
        apply_specdrop(model, target="nothing_here", num_branches=2)
    with pytest.raises(ValueError, match="nested"):
        apply_specdrop(nn.Sequential(_mlp()), target=r"^0", num_branches=2)
    with pytest.raises(TypeError, match="unknown options"):
        apply_specdrop(nn.Sequential(_mlp()), target=r"^0$", num_branches=2, p_actve=1.0)


def test_bad_options_raise_at_construction():
    with pytest.raises(ValueError, match="num_branches"):
        SpecDropBranches(_mlp(), 1)
    with pytest.raises(ValueError, match="merge"):
        SpecDropBranches(_mlp(), 2, merge="hard")
    with pytest.raises(ValueError, match="hard routing"):
        SpecDropBranches(_mlp(), 2, p_inactive=0.0)
    with pytest.raises(ValueError, match="in_features"):
        SpecDropBranches(nn.GELU(), 2, merge="router")


def _digits_loader():
    from lit_lowrank.datamodules import DigitsDataModule

    dm = DigitsDataModule(batch_size=32)
    dm.setup("fit")
    return dm


def _trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    defaults = {"max_steps": 3, "default_root_dir": tmp_path, "logger": False, "enable_checkpointing": False,
                "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
                "accelerator": "cpu"}
    return pl.Trainer(**{**defaults, **kwargs})


@pytest.mark.parametrize("merge", ["specdrop", "router"])
def test_classification_module_survives_checkpoint_reload(merge, tmp_path):
    torch.manual_seed(0)
    branches = {"target": r"backbone\.layers\.2$", "num_branches": 3, "merge": merge}
    module = ClassificationModule("mlp", num_classes=10, in_chans=1, branches=branches,
                                  backbone_kwargs={"in_features": 64, "hidden_sizes": [32, 32]})
    dm = _digits_loader()
    trainer = _trainer(tmp_path)
    trainer.fit(module, datamodule=dm)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=False)[SURGERY_CHECKPOINT_KEY][0]["method"] == "specdrop"
    reloaded = ClassificationModule.load_from_checkpoint(path)
    assert isinstance(reloaded.backbone.layers[2], SpecDropBranches)
    assert reloaded.hparams.branches == branches
    batch = next(iter(dm.val_dataloader()))
    module.eval(), reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(batch["x"], batch["category"]), module(batch["x"], batch["category"]))


def test_router_aux_loss_is_added_to_the_task_loss():
    torch.manual_seed(0)
    module = ClassificationModule("mlp", num_classes=10, in_chans=1,
                                  backbone_kwargs={"in_features": 64, "hidden_sizes": [32, 32]},
                                  branches={"target": r"backbone\.layers\.2$", "num_branches": 3, "merge": "router",
                                            "aux_loss_weight": 0.5})
    batch = next(iter(_digits_loader().train_dataloader()))
    out = module.step(batch)
    aux = specdrop_aux_loss(module)
    assert aux is not None and aux.item() >= 0.5 - 1e-6  # weight * LB, and LB >= 1
    ce = torch.nn.functional.cross_entropy(out["logits"], batch["y"])
    torch.testing.assert_close(out["loss"], ce + aux)
    module.eval()
    assert specdrop_aux_loss(module) is not None  # from the training forward ...
    module.step(batch)
    assert specdrop_aux_loss(module) is None  # ... and none in eval


def test_plain_user_module_rebuilds_from_surgery_records():
    from lit_lowrank.core import rebuild_surgery, save_surgery

    torch.manual_seed(0)
    trained = PlainSpecDropClassifier()
    checkpoint: dict = {}
    save_surgery(trained, checkpoint)
    fresh = nn.Module()
    fresh.body = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU()))
    assert rebuild_surgery(fresh, checkpoint) == ["specdrop"]
    fresh.head = nn.Linear(32, 10)
    fresh.load_state_dict(trained.state_dict())


class _OneHotBranches(pl.LightningModule):
    """Constructed case: branch k outputs the constant logit vector 10 e_k, and class == category,
    so a category is classified right only while its own branch is present."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 3)
        apply_specdrop(self, target=["net"], num_branches=3, init="copy")
        for k, branch in enumerate(self.net.branches):
            nn.init.zeros_(branch.weight)
            with torch.no_grad():
                branch.bias.copy_(10 * torch.eye(3)[k])

    def forward(self, x):
        return self.net(x)

    def validation_step(self, batch, batch_idx):
        with specdrop_category(self, batch["category"]):
            self.log("val/acc", (self(batch["x"]).argmax(-1) == batch["y"]).float().mean())


def test_sensitivity_callback_on_a_constructed_case(tmp_path):
    category = torch.arange(3).repeat(10)
    rows = [{"x": torch.randn(2), "y": c, "category": c} for c in category]
    callback = SpecDropSensitivity(max_batches=None)
    trainer = pl.Trainer(logger=CSVLogger(tmp_path), callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    module = _OneHotBranches()
    with ablate_branch(module, 1), specdrop_category(module, torch.tensor([1])):
        assert module(torch.randn(1, 2)).argmax(-1).item() != 1
    trainer.validate(module, DataLoader(rows, batch_size=8))
    torch.testing.assert_close(callback.matrix, torch.eye(3, dtype=torch.float64))
    assert trainer.callback_metrics["method/specdrop/branch_specialization"].item() == 1.0
    assert trainer.callback_metrics["method/specdrop/specialization_gap"].item() == pytest.approx(1.0)
    log_dir = Path(trainer.loggers[0].log_dir)
    assert list((log_dir / "images").glob("method_specdrop_sensitivity_step*.png"))  # labelled heatmap
    assert (log_dir / "specdrop_sensitivity_epoch0.csv").is_file()


def test_sensitivity_callback_requires_specdrop_blocks(tmp_path):
    module = ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64})
    trainer = _trainer(tmp_path, callbacks=[SpecDropSensitivity()], limit_val_batches=1)
    with pytest.raises(ValueError, match="no SpecDrop blocks"):
        trainer.fit(module, datamodule=_digits_loader())


def test_diagnostics_are_logged_under_method_specdrop(tmp_path):
    torch.manual_seed(0)
    module = ClassificationModule("mlp", num_classes=10, in_chans=1,
                                  backbone_kwargs={"in_features": 64, "hidden_sizes": [32, 32]},
                                  branches={"target": r"backbone\.layers\.2$", "num_branches": 3, "merge": "router"})
    trainer = _trainer(tmp_path)
    trainer.fit(module, datamodule=_digits_loader())
    keys = set(trainer.callback_metrics)
    assert {"method/specdrop/branch_weight/0", "method/specdrop/router_entropy", "method/specdrop/aux_loss"} <= keys


def test_language_model_branches_sensitivity_and_lora_router(tmp_path):
    from lit_lowrank.tasks import CausalLMModule

    torch.manual_seed(0)
    tiny = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}
    ids = torch.randint(0, 258, (8, 17))
    rows = [{"input_ids": r[:-1], "labels": r[1:], "position_ids": torch.arange(16),
             "doc_ids": torch.zeros(16, dtype=torch.long), "category": torch.tensor(i % 2)} for i, r in enumerate(ids)]
    module = CausalLMModule(model_config=tiny, branches={"target": r"model\.model\.layers\.1\.mlp$", "num_branches": 2})
    callback = SpecDropSensitivity(max_batches=None)
    trainer = pl.Trainer(logger=False, callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu")
    trainer.validate(module, DataLoader(rows, batch_size=4))
    assert callback.matrix.shape == (2, 2)  # loss increase per source when a branch is zeroed
    assert "method/specdrop/branch_specialization" in trainer.callback_metrics

    lora = CausalLMModule(model_config=tiny, branches={
        "target": ["q_proj", "v_proj"], "num_branches": 3, "branch_type": "lora", "lora_rank": 2,
        "merge": "router", "router_top_k": 2, "freeze_others": True})
    assert len(specdrop_blocks(lora)) == 4
    batch = {k: torch.stack([r[k] for r in rows[:4]]) for k in rows[0]}
    out = lora.step(batch)
    assert specdrop_aux_loss(lora) is not None
    out["loss"].backward()
    grads = {n for n, p in lora.named_parameters() if p.grad is not None}
    assert grads and all(".branches." in n or ".router." in n for n in grads)


def test_renormalised_ablation_sees_no_specialisation_in_tied_branches():
    """K weight-tied copies: pruning any branch with renormalisation leaves the output unchanged,
    while plain zeroing shrinks it by the pruned branch's weight (the own branch's 1/1.4 at K=5)."""
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 5, merge="specdrop", init="copy")
    block.branches = nn.ModuleList([block.branches[0]] * 5)
    model = nn.Sequential(block)
    x, category = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    with specdrop_category(model, category):
        full = model(x)
        for k in range(5):
            with ablate_branch(model, k):
                torch.testing.assert_close(model(x), full)
        with ablate_branch(model, 0, renormalise=False):
            shrunk = model(x)
    torch.testing.assert_close(shrunk[0], full[0] * (1 - 1 / 1.4))  # sample 0's own branch is 0
    torch.testing.assert_close(shrunk[1], full[1] * (1 - 0.1 / 1.4))
    assert block.ablated_branch is None and block.ablation_renormalise


def test_router_ablation_reroutes_and_soft_moe_renormalises():
    import copy

    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(5, 3, 8)
    router = nn.Sequential(SpecDropBranches(_mlp(), 3, merge="router", router_top_k=1))
    router.eval()
    with torch.no_grad():
        full = router(x)
        chosen = router[0].router(x).argmax(-1)  # (5, 3) expert per position
        with ablate_branch(router, 1):
            y = router(x)
            assert float(router[0].last_stats["branch_weight"][1]) == 0.0  # expert 1 never chosen
        # re-routing = the router that can never pick expert 1, run unablated
        never_1 = copy.deepcopy(router)
        never_1[0].router.bias[1] = -1e9
        torch.testing.assert_close(y, never_1(x))
    moved = chosen == 1
    assert moved.any() and (~moved).any()
    torch.testing.assert_close(y[~moved], full[~moved])  # positions routed elsewhere are untouched
    assert (y[moved] - full[moved]).abs().amax(-1).min() > 0  # every moved position gets another expert

    block = SpecDropBranches(_mlp(), 3, merge="soft_moe")
    soft = nn.Sequential(block)
    with torch.no_grad(), ablate_branch(soft, 2):
        y = soft(x)
        # by hand: dispatch over tokens unchanged, combine renormalised over the remaining slots 0 and 1
        logits = F.normalize(x, dim=-1) @ (block.soft_moe_scale * F.normalize(block.soft_moe_slots, dim=0))
        slot_inputs = torch.einsum("bts,btd->bsd", logits.softmax(1), x)
        combine = logits[..., :2].softmax(-1)
        outs = torch.cat([block.branches[k](slot_inputs[:, k : k + 1]) for k in range(2)], dim=1)
        torch.testing.assert_close(y, torch.einsum("bts,bsd->btd", combine, outs))


def test_demix_is_the_category_branch_alone():
    torch.manual_seed(0)
    block = SpecDropBranches(_mlp(), 3, merge="demix")
    x, category = torch.randn(4, 8), torch.tensor([2, 0, 1, 2])
    block.category = category
    expected = torch.stack([block.branches[int(c)](x[i]) for i, c in enumerate(category)])
    torch.testing.assert_close(block(x), expected)


def test_tag_aware_router_reads_the_category_and_mod_squad_adds_mutual_information():
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    tagged = SpecDropBranches(_mlp(), 3, merge="router", router_top_k=1, router_categories=2)
    with pytest.raises(ValueError, match="no category tag"):
        tagged(x)
    with torch.no_grad():
        tagged.router_category_bias.copy_(torch.tensor([[50.0, 0.0, 0.0], [0.0, 0.0, 50.0]]))
    tagged.category = torch.tensor([0, 0, 0, 1, 1, 1])
    tagged(x)
    torch.testing.assert_close(tagged.last_stats["branch_weight"], torch.tensor([0.5, 0.0, 0.5]))
    plain = SpecDropBranches(_mlp(), 3, merge="router", router_top_k=2, router_categories=2)
    squad = SpecDropBranches(_mlp(), 3, merge="router", router_top_k=2, router_categories=2, mi_loss_weight=1.0)
    squad.load_state_dict(plain.state_dict())
    for block in (plain, squad):
        block.category = torch.tensor([0, 0, 0, 1, 1, 1])
        block(x)
    assert not torch.allclose(plain.aux_loss, squad.aux_loss)
    assert float(squad.aux_loss.detach()) <= float(plain.aux_loss.detach()) + 1e-6  # minus a mutual information (>= 0)
    with pytest.raises(ValueError, match="mi_loss_weight"):
        SpecDropBranches(_mlp(), 3, merge="router", mi_loss_weight=0.1)
    with pytest.raises(ValueError, match="router_categories"):
        SpecDropBranches(_mlp(), 3, merge="specdrop", router_categories=2)


def test_hydra_lora_shares_one_a_across_heads(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    apply_specdrop(model, target=["0"], num_branches=3, branch_type="lora", lora_rank=2, lora_shared_A=True,
                   merge="router", router_top_k=3, freeze_others=True)
    block = model[0]
    assert all(b.lora_A is block.branches[0].lora_A for b in block.branches)
    assert len({id(b.lora_B) for b in block.branches}) == 3
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"0.branches.0.lora_A.weight", "0.router.weight", "0.router.bias",
                         *(f"0.branches.{k}.lora_B.weight" for k in range(3))}
    apply_specdrop(model, target=["0"], num_branches=3, branch_type="lora", lora_rank=2, lora_shared_A=True,
                   merge="router", router_top_k=3, freeze_others=True)  # idempotent
    assert model[0] is block
    torch.save(model.state_dict(), tmp_path / "m.pt")
    twin = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    apply_specdrop(twin, target=["0"], num_branches=3, branch_type="lora", lora_rank=2, lora_shared_A=True,
                   merge="router", router_top_k=3)
    twin.load_state_dict(torch.load(tmp_path / "m.pt"))
    x = torch.randn(2, 8)
    torch.testing.assert_close(twin(x), model(x))
    with pytest.raises(ValueError, match="lora_shared_A"):
        SpecDropBranches(_mlp(), 3, lora_shared_A=True)
