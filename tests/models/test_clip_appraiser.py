"""CAMEL's CLIP Appraiser on a tiny random CLIP: zero-shot parity, adapter-only inner loop, gradient flow, loading."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.models.clip_appraiser import CLIPAppraiser
from lit_lowrank.ops.camel import adapt_appraiser, camel_reward, classification_loss

VOCAB, BOS, EOS, PAD = 50, 48, 49, 1


def _tiny_clip(seed: int = 0):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=8, eos_token_id=EOS, bos_token_id=BOS,
                         pad_token_id=PAD),
        vision_config=dict(image_size=8, patch_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2),
        projection_dim=8)
    # SDPA keeps float64 end to end on CPU; the eager path runs its softmax in float32, which finite differences
    # in float64 would read as a ~5% gradient error.
    config._attn_implementation = "sdpa"
    return CLIPModel(config).eval()


def _prompts(num: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(2, BOS, (num, 5), generator=gen)
    ids[:, 0], ids[:, -1] = BOS, EOS
    return ids


def _appraiser(num_prompts: int = 3, **kwargs) -> CLIPAppraiser:
    return CLIPAppraiser(_tiny_clip(), _prompts(num_prompts), rank=2, alpha=4.0, **kwargs)


def test_logits_at_phi0_are_clips_zero_shot_logits():
    clip = _tiny_clip()
    ids = _prompts(3)
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = clip(input_ids=ids, pixel_values=x).logits_per_image
    # identity pre-/post-processing so pixel_values == x; the fresh adapter (B = 0) changes nothing
    appraiser = CLIPAppraiser(clip, ids, rank=2, data_mean=(0.0,), data_std=(1.0,), image_mean=(0.0,) * 3,
                              image_std=(1.0,) * 3)
    with torch.no_grad():
        ours = appraiser(x)
        from_feats = appraiser(appraiser.embed_images(x))
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_feats, ours)


def test_only_the_text_projection_adapter_is_adapted():
    appraiser = _appraiser()
    phi0 = {k: v.detach() for k, v in appraiser.adapter_params().items()}
    assert sorted(k.rsplit(".", 3)[-3] for k in phi0) == ["lora_A", "lora_B"]
    assert all(k.startswith("clip.text_projection.") for k in phi0)
    assert not any(p.requires_grad for p in appraiser.parameters())
    frozen = {k: v.detach().clone() for k, v in appraiser.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    x_train = torch.randn(6, 3, 8, 8, generator=gen, requires_grad=True)
    x_heldout = torch.randn(6, 3, 8, 8, generator=gen)
    phik = adapt_appraiser(appraiser, phi0, appraiser.embed_images(x_train), steps=2, lr=1.0,
                           loss_fn=classification_loss(1))
    assert phik.keys() == phi0.keys()
    assert all(not torch.equal(phik[k], phi0[k]) for k in phi0)  # B moves in step 1, A once B != 0
    out = camel_reward(appraiser, phi0, appraiser.embed_images(x_train), appraiser.embed_images(x_heldout), steps=2,
                       lr=1.0, loss_fn=classification_loss(1))
    out["reward"].backward()
    assert x_train.grad is not None and x_train.grad.abs().sum() > 0
    assert all(p.grad is None for p in appraiser.parameters())
    for k, v in appraiser.state_dict().items():  # the module itself (CLIP and its adapter) is untouched
        assert torch.equal(v, frozen[k]), k


def test_adapting_on_a_class_lowers_its_loss():
    appraiser = _appraiser()
    x = appraiser.embed_images(torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(2)))
    phi0 = {k: v.detach() for k, v in appraiser.adapter_params().items()}
    out = camel_reward(appraiser, phi0, x, x, steps=5, lr=2.0, loss_fn=classification_loss(2))
    assert out["lk"] < out["l0"] and out["reward"] > 0


def test_reward_gradient_through_clip_inner_loop_matches_finite_differences():
    """z -> images -> frozen CLIP image tower -> 2 second-order steps on the adapter -> R, gradcheck in z."""
    appraiser = _appraiser().double()
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(8, 3, 8, 8, generator=gen, dtype=torch.float64)
    mix = torch.randn(3, 8 * 3 * 8 * 8, generator=gen, dtype=torch.float64) * 0.5
    phi0 = {k: v.detach() for k, v in appraiser.adapter_params().items()}

    def terms(z, first_order=False):
        images = torch.tanh(base + (z @ mix).view(8, 3, 8, 8))
        feats = appraiser.embed_images(images)
        out = camel_reward(appraiser, phi0, feats[:4], feats[4:], steps=2, lr=0.5, loss_fn=classification_loss(0),
                           first_order=first_order)
        return torch.stack([out["reward"], out["lk"]])

    z = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    (second,) = torch.autograd.grad(terms(z)[1], z)
    (first,) = torch.autograd.grad(terms(z, first_order=True)[1], z)
    # not vacuous: L_K depends on z, and part of that dependence runs through the inner loop's gradients
    assert second.abs().max() > 1e-4 and (second - first).abs().max() > 1e-3 * second.abs().max()
    assert torch.autograd.gradcheck(terms, (z,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="rank"):
        CLIPAppraiser(_tiny_clip(), _prompts(3), rank=0)
    with pytest.raises(ValueError, match="input_ids"):
        CLIPAppraiser(_tiny_clip(), _prompts(1))
    with pytest.raises(TypeError, match="CLIPModel"):
        CLIPAppraiser(torch.nn.Linear(2, 2), _prompts(3))
    appraiser = _appraiser()
    with pytest.raises(ValueError, match="already carries a LoRA"):
        CLIPAppraiser(appraiser.clip, _prompts(3))
    with pytest.raises(ValueError, match="images"):
        appraiser.embed_images(torch.zeros(2, 2, 8, 8))
    with pytest.raises(FileNotFoundError, match="clip_path"):
        CLIPAppraiser.from_pretrained("/nonexistent/clip", ["a", "b"])
    with pytest.raises(ValueError, match="target"):
        classification_loss(5)(appraiser, appraiser.adapter_params(), torch.zeros(2, 3, 8, 8))


def _save_tiny_clip(directory) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "photo", "of", "cat", "dog", "bird", "."]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    clip = _tiny_clip()
    clip.config.text_config.eos_token_id = 2  # legacy CLIP pooling (argmax id) is fine for this vocabulary
    clip.save_pretrained(directory)
    tok.save_pretrained(directory)


def test_from_pretrained_loads_a_local_clip_and_tokenises_the_prompts(tmp_path):
    _save_tiny_clip(tmp_path)
    appraiser = CLIPAppraiser.from_pretrained(tmp_path, ["cat", "dog", "bird"], template="a photo of {} .", rank=2)
    assert appraiser.num_prompts == 3
    assert len(appraiser.adapter_params()) == 2
    assert appraiser(torch.zeros(2, 1, 8, 8)).shape == (2, 3)


def test_alignment_loss_is_one_minus_the_prompt_cosine_and_adapting_lowers_it():
    from lit_lowrank.ops.camel import alignment_loss

    appraiser = _appraiser()
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats = appraiser.embed_images(x)
        cosines = appraiser(feats, scaled=False)
        torch.testing.assert_close(appraiser(feats), appraiser.clip.logit_scale.exp() * cosines)
    phi0 = {k: v.detach() for k, v in appraiser.adapter_params().items()}
    loss_fn = alignment_loss(target=1)
    assert float(loss_fn(appraiser, phi0, feats)) == pytest.approx(float(1 - cosines[:, 1].mean()), abs=1e-6)
    adapted = adapt_appraiser(appraiser, phi0, feats, steps=3, lr=1.0, loss_fn=loss_fn)
    assert float(loss_fn(appraiser, adapted, feats)) < float(loss_fn(appraiser, phi0, feats))
    with pytest.raises(ValueError, match="target"):
        alignment_loss(target=-1)
