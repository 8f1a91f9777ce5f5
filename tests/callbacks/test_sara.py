import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn

from lit_lowrank.callbacks import SARA
from lit_lowrank.callbacks.sara_controller import SARAController, apply_sara, auto_block_name
from lit_lowrank.datamodules import DigitsDataModule
from lit_lowrank.ops.sara.svd_linear import SVDLinear
from lit_lowrank.tasks import DiffusionModule
from tests.callbacks.sara_plain import PlainUserDiffusion, TinyConditionalDenoiser


def _module(seed: int = 0, unet: bool = False) -> DiffusionModule:
    torch.manual_seed(seed)
    if unet:  # the real diffusers UNet2DModel (attention Linear layers); slower, used once
        return DiffusionModule(num_classes=10).eval()
    return DiffusionModule(model=TinyConditionalDenoiser(), num_classes=10, num_train_timesteps=100).eval()


def _sample(module, n=4, steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn((n, 1, 8, 8), generator=g)
    return module.sample(n, class_labels=torch.arange(n) % 10, num_inference_steps=steps, noise=noise)


def _trainer(tmp_path, callbacks, **kwargs):
    defaults = dict(max_steps=2, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    return pl.Trainer(callbacks=callbacks, **{**defaults, **kwargs})


def test_auto_blocks():
    assert auto_block_name("down_blocks.1.attentions.0.to_q") == "down_blocks.1"
    assert auto_block_name("transformer_blocks.3.ff.net.2") == "transformer_blocks.3"
    assert auto_block_name("time_embedding.linear_1") == "time_embedding"


def test_controller_restores_the_original_layers():
    module = _module(unet=True)
    before = _sample(module, n=2, steps=2)
    originals = {n: m for n, m in module.model.named_modules() if isinstance(m, nn.Linear)}
    state = {k: v.clone() for k, v in module.model.state_dict().items()}
    with apply_sara(module.model, mode="uniform", budget=0.25) as sara:
        assert set(sara.layers) == set(originals)
        assert all(isinstance(module.model.get_submodule(n), SVDLinear) for n in originals)
        truncated = _sample(module, n=2, steps=2)
        assert sara.macs_ratio() < 1
    assert not torch.equal(truncated, before)
    after = {n: m for n, m in module.model.named_modules() if isinstance(m, nn.Linear)}
    assert after.keys() == originals.keys() and all(after[n] is originals[n] for n in originals)
    assert not module.model._forward_hooks and not module.model._forward_pre_hooks
    assert all(torch.equal(v, state[k]) for k, v in module.model.state_dict().items())
    assert torch.equal(_sample(module, n=2, steps=2), before)


def test_full_rank_reproduces_samples_exactly_and_steps_follow_the_timestep():
    module = _module()
    before = _sample(module, steps=5)
    controller = SARAController(module.model).attach()  # no step_source: the timestep rule
    try:
        assert torch.equal(_sample(module, steps=5), before)
        assert len(controller.step_ranks) == 5 and controller.macs_ratio() == 1.0
        controller.set_uniform(0.25)
        controller.reset_macs()
        _sample(module, steps=3)  # a second run restarts at step 0
        assert len(controller.step_ranks) == 3 and controller.step == 2
    finally:
        controller.detach()


def test_dp_schedule_meets_the_budget_and_beats_nothing_by_construction():
    module = _module()
    controller = SARAController(module.model, step_source=lambda: module.current_step_index).attach()
    try:
        schedule = controller.calibrate(lambda: _sample(module, n=2, steps=3, seed=5), budget=0.5)
        assert schedule.shape == (3, len(controller.blocks))
        # the realised MACs of a run with another batch size respect the budget (costs scale with rows)
        _sample(module, n=6, steps=3)
        assert controller.macs_ratio() <= 0.5 + 1e-9
        # the DP's objective is no worse than the uniform schedule at the same level with a lower cost
        e, c = controller.calibration_errors, controller.calibration_costs
        chosen = e[torch.arange(3)[:, None].numpy(), torch.arange(e.shape[1])[None].numpy(), schedule].sum()
        for level in range(len(controller.levels)):
            if c[..., level].sum() <= 0.5 * c[..., -1].sum():
                assert chosen <= e[..., level].sum() + 1e-12
        with pytest.raises(ValueError, match="num_inference_steps=3"):
            _sample(module, n=2, steps=4)
    finally:
        controller.detach()


@pytest.mark.parametrize("mode", ["online", "dp"])
def test_callback_factors_during_test_and_restores_after(tmp_path, mode):
    module = _module().train()
    seen = {}

    class Probe(pl.Callback):
        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            seen["svd"] = any(isinstance(m, SVDLinear) for m in pl_module.model.modules())

    # the test loss calls the denoiser at random timesteps outside a sampling loop: a DP schedule is
    # read at the calibrated step with the nearest timestep
    sara = SARA(mode=mode, threshold=0.5, eval_samples=0, num_inference_steps=3, calibration_samples=2)
    _trainer(tmp_path, [sara, Probe()], limit_test_batches=1).test(module, datamodule=DigitsDataModule(batch_size=16))
    assert seen["svd"] is True
    assert not any(isinstance(m, SVDLinear) for m in module.model.modules())
    assert sara.controller is None


def test_validation_diagnostic_in_fit(tmp_path):
    sara = SARA(mode="dp", budget=0.6, num_inference_steps=3, calibration_samples=2, eval_samples=3)
    module = _module().train()
    trainer = _trainer(tmp_path, [sara], limit_val_batches=1, val_check_interval=2, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=16))
    metrics = trainer.callback_metrics
    assert 0 < float(metrics["method/sara/macs_ratio"]) <= 0.6 + 1e-9
    assert float(metrics["method/sara/sample_rel_error"]) >= 0
    assert not any(isinstance(m, SVDLinear) for m in module.model.modules())


def test_plain_module_and_clear_errors():
    plain = PlainUserDiffusion()
    sara = SARA(mode="uniform", budget=0.25, num_inference_steps=4, eval_samples=4)
    ratio, error = sara.evaluate(plain)
    assert ratio < 1 and error > 0
    assert not any(isinstance(m, SVDLinear) for m in plain.modules())
    with pytest.raises(ValueError, match="mode"):
        SARA(mode="fast")
    with pytest.raises(ValueError, match="budget"):
        SARA(budget=1.5)
    with pytest.raises(ValueError, match="denoiser_attr"):
        SARA(denoiser_attr="unet").attach(plain)
    with pytest.raises(ValueError, match="target"):
        SARAController(plain.model, target="nothing_like_this").attach()


def test_unet_convs_are_factored_exact_at_full_rank_and_restored():
    module = _module(unet=True)
    before = _sample(module, n=2, steps=2)
    convs = {n: m for n, m in module.model.named_modules() if isinstance(m, nn.Conv2d)}
    assert any(m.kernel_size == (3, 3) for m in convs.values())
    with SARAController(module.model, include_conv=True,
                        step_source=lambda: module.current_step_index) as sara:
        assert set(convs) <= set(sara.layers)
        assert {sara.layers[n].kind for n in convs} == {"conv", "pointwise"}
        assert torch.equal(_sample(module, n=2, steps=2), before)  # full rank: the original convs run
        assert sara.macs_ratio() == 1.0
        sara.reset_macs()
        sara.set_uniform(0.25)
        truncated = _sample(module, n=2, steps=2)
        assert 0 < sara.macs_ratio() < 0.5
    assert not torch.equal(truncated, before)
    assert all(module.model.get_submodule(n) is m for n, m in convs.items())
    assert torch.equal(_sample(module, n=2, steps=2), before)


def test_online_reads_the_previous_output_spectrum_and_replays_as_fractions():
    from lit_lowrank.ops.sara.rank import fraction_rank, online_rank_fraction

    module = _module()
    seen = []

    def signal(output, args, kwargs):  # record what the rule reads: the output itself by default
        seen.append(output.clone())
        return output

    with SARAController(module.model, step_source=lambda: module.current_step_index, signal=signal) as c:
        c.set_online(0.3)
        online = _sample(module, n=4, steps=4)
        fractions = list(c.step_fractions)
        assert len(fractions) == 4 and fractions[0] == 1.0  # no previous output: the first step is dense
        for step in range(1, 4):  # each step's fraction comes from the previous step's output
            assert fractions[step] == pytest.approx(online_rank_fraction(seen[step - 1], 0.3))
            assert fractions[step] < 1.0
            assert all(c.step_ranks[step][n] == fraction_rank(fractions[step], c.layers[n].full_rank)
                       for n in c.layers)
        # the same fractions as a fixed schedule reproduce the online run exactly
        c.set_fractions(fractions)
        c.reset_macs()
        assert torch.equal(_sample(module, n=4, steps=4), online)
        with pytest.raises(ValueError, match="fraction schedule"):
            _sample(module, n=4, steps=5)
        with pytest.raises(ValueError, match="fractions"):
            c.set_fractions([1.2])


def test_exclude_keeps_conditioning_layers_dense():
    from lit_lowrank.callbacks.sara_controller import CONDITIONING_LAYERS

    module = _module(unet=True)
    names = {n for n, m in module.model.named_modules() if isinstance(m, nn.Linear)}
    with SARAController(module.model, exclude=CONDITIONING_LAYERS) as c:
        kept = names - set(c.layers)
        assert kept and all("time_emb" in n for n in kept)  # the UNet's timestep embedder / projections
        assert set(c.layers) and not any("time_emb" in n for n in c.layers)


def test_dp_weights_each_steps_errors_by_its_measured_propagation_gain():
    module = _module()
    run = lambda: _sample(module, n=2, steps=3, seed=5)  # noqa: E731
    reference = run()
    with SARAController(module.model, step_source=lambda: module.current_step_index) as c:
        c.calibrate(run, budget=0.5, propagate=False)
        assert np.array_equal(c.step_gains, np.ones(3))
        unweighted = c.calibration_errors.copy()
        c.calibrate(run, budget=0.5, probe=0.25)
        gains = c.step_gains
        assert gains.shape == (3,) and (gains > 0).all() and not np.allclose(gains, 1.0)
        np.testing.assert_allclose(c.output_errors, unweighted)
        np.testing.assert_allclose(c.calibration_errors, unweighted * gains[:, None, None])
        # the probe of the last step is a run with only that step truncated: its gain is the final error
        # of such a run over that step's output error, both positive
        c.set_fractions([1.0, 1.0, 0.25])
        c.reset_macs()
        probed = run()
        assert float((probed - reference).norm()) > 0
        with pytest.raises(ValueError, match="return the samples"):
            c.calibrate(lambda: {"x": run()}, budget=0.5)
        with pytest.raises(ValueError, match="probe"):
            c.calibrate(run, budget=0.5, probe=1.0)
    assert torch.equal(run(), reference)  # probes leave nothing behind


def test_calibrate_refuses_a_run_that_is_not_deterministic_and_names_generator():
    module = _module()
    unseeded = lambda: module.sample(2, class_labels=torch.arange(2), num_inference_steps=3)  # noqa: E731
    with SARAController(module.model, step_source=lambda: module.current_step_index) as c:
        for propagate in (False, True):
            with pytest.raises(ValueError, match="generator="):
                c.calibrate(unseeded, budget=0.5, propagate=propagate)
        assert c.policy == "full" and c.schedule is None  # nothing half-installed
        seeded = lambda: module.sample(2, class_labels=torch.arange(2), num_inference_steps=3,  # noqa: E731
                                       generator=torch.Generator().manual_seed(0))
        assert c.calibrate(seeded, budget=0.5).shape == (3, len(c.blocks))


def test_the_cards_pipeline_example_runs_on_a_tiny_diffusers_dit_pipeline():
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    torch.manual_seed(0)
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                        num_layers=2, sample_size=4, patch_size=2, num_embeds_ada_norm=1000,
                                        norm_num_groups=1)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), latent_channels=4,
                        norm_num_groups=4, sample_size=8)
    transformer.eval(), vae.eval()  # as from_pretrained leaves them (train mode drops class labels at random)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler(num_train_timesteps=100),
                       id2label={i: f"class{i}" for i in range(10)})
    pipe.set_progress_bar_config(disable=True)

    def run():  # the card's example: a seeded generator makes the calibration runs comparable
        return pipe(class_labels=[1, 2], num_inference_steps=3, generator=torch.Generator().manual_seed(0),
                    output_type="np")

    reference = run().images
    with apply_sara(pipe.transformer) as sara:
        schedule = sara.calibrate(run, budget=0.6)
        assert schedule.shape == (3, len(sara.blocks))
        sara.reset_macs()
        images = run().images  # the calibrated schedule, under classifier-free guidance (batch 2 per label)
        assert 0 < sara.macs_ratio() <= 0.6 + 1e-6
        assert images.shape == reference.shape and not np.array_equal(images, reference)
        with pytest.raises(ValueError, match="generator="):  # the same pipeline unseeded
            sara.calibrate(lambda: pipe(class_labels=[1, 2], num_inference_steps=3, output_type="np"), budget=0.6)
    # PIL output (the pipeline's default) is read too
    with apply_sara(pipe.transformer) as sara:
        sara.calibrate(lambda: pipe(class_labels=[1], num_inference_steps=3,
                                    generator=torch.Generator().manual_seed(0)), budget=0.6, propagate=False)
    np.testing.assert_array_equal(run().images, reference)  # detached: the pipeline is as before


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
def test_clean_sample_signal_recovers_x0_from_each_parameterisation(prediction_type):
    from lit_lowrank.callbacks.sara_controller import clean_sample_signal

    torch.manual_seed(0)
    alphas = torch.linspace(0.99, 0.01, 100)
    x0, eps, t = torch.randn(2, 1, 8, 8), torch.randn(2, 1, 8, 8), 40
    a = alphas[t]
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
    output = {"epsilon": eps, "v_prediction": a.sqrt() * eps - (1 - a).sqrt() * x0, "sample": x0}[prediction_type]
    signal = clean_sample_signal(alphas, prediction_type)
    torch.testing.assert_close(signal(output, (x_t, torch.full((2,), t)), {}), x0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(signal(output, (x_t,), {"timestep": t}), x0, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="prediction_type"):
        clean_sample_signal(alphas, "flow")


def test_online_first_step_runs_at_first_fraction():
    module = _module()
    with SARAController(module.model, step_source=lambda: module.current_step_index) as c:
        c.set_online(0.3)
        _sample(module, n=2, steps=3)
        assert c.step_fractions[0] == 1.0  # the default: dense (no previous output to read)
        c.set_online(0.3, first_fraction=0.25)
        _sample(module, n=2, steps=3)
        assert c.step_fractions[0] == 0.25 and len(c.step_fractions) == 3
        with pytest.raises(ValueError, match="first_fraction"):
            c.set_online(0.3, first_fraction=1.5)
