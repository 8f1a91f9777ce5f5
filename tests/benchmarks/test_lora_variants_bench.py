"""lora_variants benchmark pieces: the condition sweep's dynamics, lr selection, the LoKr budget matcher."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.lora_variants.condition_sweep import condition_run, tuned_lr


def test_the_condition_sweep_sees_kappa_where_it_must():
    # ill-conditioned solution: LoRA's slow directions stay slow (it never reaches the tolerance at κ = 1000)
    lora = {k: condition_run("lora", k, 0.5, 400, seed=0, setting="target") for k in (1.0, 1000.0)}
    assert lora[1000.0].steps == 400 > 10 * lora[1.0].steps
    # ill-conditioned initial factors: SDS's basis gradients never see the factors' scales
    sds = {k: condition_run("sds_lora", k, 0.5, 400, seed=0, setting="init") for k in (1.0, 1000.0)}
    assert sds[1000.0].steps <= 2 * sds[1.0].steps < 400


def test_a_diverging_rate_is_counted_not_crashed_and_tuning_avoids_it():
    run = condition_run("lora", 1.0, 50.0, 50, seed=0)
    assert run.diverged and run.steps == 50 and run.loss_at == 1e6 * run.loss0
    assert tuned_lr("lora", 1.0, 100, tuning_seeds=[100], grid=(50.0, 0.2)) == 0.2


def test_select_lr_reads_validation_loss_only():
    from lit_lowrank.benchmarks.lora_variants.finetune import select_lr

    rows = [{"method": "m", "lr": lr, "seed": s, "val_loss": v, "test_loss": -v}
            for lr, v in ((1e-3, 0.9), (3e-3, 0.7), (1e-2, 0.8)) for s in (0, 1)]
    assert select_lr(rows, "m", seeds=[0, 1]) == 3e-3


def test_lokr_parameter_count_is_pefts_and_the_match_stays_within_loras_budget():
    from torch import nn

    from lit_lowrank.adapters import inject_adapters
    from lit_lowrank.benchmarks.lora_variants.finetune import lokr_matched_kwargs, lokr_parameters

    for (out_f, in_f), rank, factor in (((384, 384), 31, 4), ((1536, 384), 8, 2), ((64, 64), 40, 8)):
        layer = nn.Sequential(nn.Linear(in_f, out_f, bias=False))
        inject_adapters(layer, method="lokr", target_modules=["0"], rank=rank, decompose_factor=factor)
        assert lokr_parameters(out_f, in_f, rank, factor) == sum(p.numel() for p in layer.parameters()
                                                                  if p.requires_grad)
    shapes = [(384, 384)] * 4 + [(1536, 384), (384, 1536)]
    kw = lokr_matched_kwargs(shapes, 8)
    used = sum(lokr_parameters(o, i, kw["rank"], kw["decompose_factor"]) for o, i in shapes)
    assert 0.9 * 8 * sum(o + i for o, i in shapes) <= used <= 8 * sum(o + i for o, i in shapes)


def test_finetune_runner_on_the_cached_minilm_top_layer_is_paired_by_seed():
    """Two steps of the real runner: the same seed gives the same row; diagnostics are present for adapters."""
    import torch

    from lit_lowrank.benchmarks.lora_variants.finetune import FinetuneConfig, MiniLMTop, finetune_run, tweet_splits

    torch.set_num_threads(1)
    splits = tweet_splits("minilm", 8, (24, 12, 12))
    trunk = MiniLMTop.from_pretrained(adapt_layers=1)
    data = trunk.prepare(splits)
    assert data["train"]["states"].shape == (24, 8, 384)
    config = FinetuneConfig(steps=2, batch_size=4, measure_every=1)
    first = finetune_run(trunk, "sds_lora", 1e-2, 0, data, config)
    again = finetune_run(trunk, "sds_lora", 1e-2, 0, data, config)
    assert first["test_loss"] == again["test_loss"] and first["grad_erank"] == again["grad_erank"]
    assert 0 < first["grad_erank"] and -1 <= first["induced_cosine"] <= 1 and first["delta_stable_rank"] >= 1
    deltas: dict = {}
    full = finetune_run(trunk, "full", 1e-4, 0, data, config, deltas=deltas)
    assert full["trainable"] > first["trainable"] and "grad_erank" not in full
    # the learned ΔW of every target Linear, and only of those: a fit target for SaMA / LoRA / LoKr
    assert sorted(n.rsplit(".", 1)[-1] for n in deltas) == ["dense", "dense", "dense", "key", "query", "value"]
    assert all(d.abs().max() > 0 for d in deltas.values())
    with pytest.raises(ValueError, match="deltas"):
        finetune_run(trunk, "lora", 1e-4, 0, data, config, deltas={})


def test_real_fit_tunes_on_a_held_out_matrix_and_pairs_units_by_seed_and_layer():
    """The fit on full fine-tuning's ΔW: every method at LoRA's budget, units = (seed, layer), the tuning matrix
    (seed 0's key) never a unit; exactly representable rank-1 targets are fitted well by LoRA."""
    import torch

    from lit_lowrank.benchmarks.lora_variants import _real_fit_rows

    gen = torch.Generator().manual_seed(0)
    names = [f"trunk.layer.0.attention.self.{k}" for k in ("query", "key", "value")]
    bases = {n: torch.randn(16, 16, generator=gen) / 4 for n in names}
    deltas = {s: {n: torch.outer(torch.randn(16, generator=gen), torch.randn(16, generator=gen)) * 1e-4
                  for n in names} for s in (0, 1)}
    rows, notes = _real_fit_rows(deltas, bases, ("lora", "lokr"), steps=60, rank=2)
    assert sorted({r["unit"] for r in rows}) == ["0/query", "0/value", "1/query", "1/value"]
    assert notes["fit_real_tuned_on"] == "seed 0, key"
    assert all(r["target"] == "minilm_full_ft" for r in rows)
    lora = [r for r in rows if r["method"] == "lora"]
    assert all(r["parameters"] == 2 * 2 * 16 for r in lora)
    assert max(r["rel_error"] for r in lora) < 0.3  # a rank-1 ΔW* (rescaled from 1e-4) is within LoRA's reach


def test_sama_fit_claims_cover_the_decaying_and_the_real_targets_with_lokr_in_its_place():
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.lora_variants import _competitors, _fit_claims

    rows = []
    for seed in range(3):
        for method, err in (("lora", 0.5), ("lora_rank1", 0.8), ("sama", 0.4), ("mora", 0.6), ("lokr", 0.45)):
            for target in ("full_rank", "decaying"):
                rows.append({"section": "fit", "target": target, "method": method, "seed": seed,
                             "rel_error": err * (1 + 0.01 * seed)})
            for layer in ("query", "value"):
                rows.append({"section": "fit", "target": "minilm_full_ft", "method": method, "seed": seed,
                             "unit": f"{seed}/{layer}",
                             "rel_error": (0.6 if method == "sama" else err) * (1 + 0.01 * seed)})
    claims, controls = _fit_claims(rows)
    by = {c["name"]: c for c in resolve(claims, [], _competitors(rows, []))}
    assert by["sama_fit_vs_lora_decaying"]["verdict"] == "holds"
    assert by["sama_fit_vs_lora_decaying"]["matched_by"]  # LoKr (0.45) also beats LoRA there
    assert by["sama_fit_vs_lora_minilm_full_ft"]["verdict"] == "fails"  # SaMA 0.6 vs LoRA 0.5 on the real ΔW
    assert by["sama_fit_vs_lora_minilm_full_ft"]["n"] == 6  # (seed, layer) units
    assert all(c["verdict"] != "holds" for c in controls)


def test_claims_need_a_kappa_that_slows_lora_and_a_gap_to_full_fine_tuning():
    """SDS-LoRA's κ-invariance is news only where κ slows LoRA; an adapter can only close a gap that exists."""
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.lora_variants import (
        _competitors,
        _condition_claims,
        _condition_premises,
        _finetune_claims,
        _finetune_premises,
    )

    rows = []
    for seed in range(4):
        for method, init_slow, target_slow in (("lora", 1.0, 10.0), ("sds_lora", 1.0, 1.0), ("scaled_gd", 1.0, 2.0)):
            for setting, slow in (("init", init_slow), ("target", target_slow)):
                for kappa, steps in ((1.0, 100.0 + seed), (1000.0, (100.0 + seed) * slow * (1 + 0.01 * seed))):
                    rows.append({"section": "condition", "method": method, "setting": setting, "kappa": kappa,
                                 "seed": seed, "steps_to_tol": steps})
    premises = {p["name"]: p for p in _condition_premises(rows)}
    assert premises["lora_slows_init"]["verdict"] in ("fails", "inconclusive")  # LoRA is not slowed at init
    assert premises["lora_slows_target"]["verdict"] == "holds"
    claims, _ = _condition_claims(rows)
    verdicts = [c["verdict"] for c in resolve(claims, list(premises.values()), [])]
    assert verdicts[0] == "no_headroom"  # SDS's init invariance: LoRA was not slowed either
    assert verdicts[2] == "holds"        # SDS's target invariance, where κ slows LoRA 10×

    ft = []
    for seed in range(3):
        for method, loss, acc in (("full", 0.9, 0.70), ("lora", 0.9 + 0.01 * (seed - 1), 0.70), ("sds_lora", 0.8, 0.8),
                                  ("scaled_gd", 1.0, 0.6), ("lora_twin", 0.9, 0.7), ("lora_shuffled_labels", 1.5, 0.3)):
            ft.append({"section": "finetune_x", "method": method, "seed": seed, "test_loss": loss, "test_acc": acc,
                       "grad_erank": 1.0, "induced_cosine": 0.0})
    gap = _finetune_premises(ft, "finetune_x", "X")
    assert [p["name"] for p in gap] == ["finetune_x_gap_loss", "finetune_x_gap_acc"]
    assert all(p["verdict"] != "holds" for p in gap)  # full fine-tuning is no better than LoRA here
    claims, _ = _finetune_claims(ft, "finetune_x", "X")
    comps = _competitors(ft, [("finetune_x", "X")])
    assert [c["for"] for c in comps] == ["finetune_x_sds_gap"]  # ScaledGD in SDS-LoRA's place
    loss_claim = resolve(claims, gap, comps)[0]
    assert loss_claim["verdict"] == "no_headroom" and loss_claim["measured_verdict"] == "holds"
    assert loss_claim["matched_by"] == []  # ScaledGD (loss 1.0) does not close the gap


def test_finetune_section_adds_a_published_lr_to_its_method_only_and_names_grid_edges():
    import torch

    from lit_lowrank.benchmarks.lora_variants import _finetune_section
    from lit_lowrank.benchmarks.lora_variants.finetune import FinetuneConfig

    torch.set_num_threads(1)
    rows, notes = _finetune_section("minilm", ("full", "lora", "pissa"), [0, 1], tune_all_seeds=False,
                                    config=FinetuneConfig(steps=1, batch_size=4, measure_every=1), max_length=8,
                                    sizes=(16, 8, 8), adapt_layers=1, adapter_lrs=(1e-3, 3e-3), full_lrs=(3e-5,),
                                    published_lrs={"pissa": (2e-5,)})
    tuned = {m: sorted(r["lr"] for r in rows if r["method"] == m and r["seed"] == 0) for m in ("lora", "pissa")}
    assert tuned == {"lora": [1e-3, 3e-3], "pissa": [2e-5, 1e-3, 3e-3]}
    assert notes["minilm_lr_grid"] == {"adapters": [1e-3, 3e-3], "full": [3e-5], "pissa": [2e-5, 1e-3, 3e-3]}
    selected = notes["minilm_selected_lr"]
    # the second seed runs only at the selected lr; a 2-point grid's choice is always on its edge
    assert all(r["lr"] == selected[r["method"]] for r in rows if r["seed"] == 1 and r["method"] in selected)
    assert notes["minilm_grid_edge"]["lora"] == selected["lora"] and notes["minilm_grid_edge"]["full"] == 3e-5
    assert ("pissa" in notes["minilm_grid_edge"]) == (selected["pissa"] != 1e-3)
