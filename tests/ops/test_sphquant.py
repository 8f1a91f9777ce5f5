"""SPHQuant math: angular parameterisation, codebook, quantize/pack/unpack, bits, fine-tuning."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.quantization import relative_error
from lit_lowrank.ops.sphquant.codec import (
    angles_from_codebook,
    assign_codewords,
    codebook_from_angles,
    finetune_codebook,
    positive_orthant_kmeans,
    sph_bits,
    sph_decode,
    sph_dequantize,
    sph_directions,
    sph_pack,
    sph_quantize,
    sph_unpack_rows,
)


def _weight(seed=0, shape=(128, 512)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_angles_round_trip_and_constraints():
    theta = torch.rand(50, 7, generator=torch.Generator().manual_seed(0)) * math.pi / 2
    c = codebook_from_angles(theta)
    torch.testing.assert_close(c.norm(dim=1), torch.ones(50))
    assert (c >= 0).all()
    torch.testing.assert_close(angles_from_codebook(c), theta, atol=1e-5, rtol=1e-5)
    # any positive unit vector has angles in [0, pi/2]
    u = torch.nn.functional.normalize(torch.rand(20, 8), dim=1)
    t = angles_from_codebook(u)
    assert (t >= 0).all() and (t <= math.pi / 2 + 1e-6).all()
    torch.testing.assert_close(codebook_from_angles(t), u, atol=1e-6, rtol=1e-5)


def test_kmeans_codebook_is_unit_nonnegative_and_beats_random():
    w = _weight()
    data = sph_directions([w])
    codebook = positive_orthant_kmeans(data, 64, iterations=8, seed=0)
    assert codebook.shape == (64, 8)
    torch.testing.assert_close(codebook.norm(dim=1), torch.ones(64))
    assert (codebook >= 0).all()
    random = torch.nn.functional.normalize(torch.rand(64, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    err_km = relative_error(w, sph_dequantize(sph_quantize(w, codebook, 4, 128), codebook))
    err_rand = relative_error(w, sph_dequantize(sph_quantize(w, random, 4, 128), random))
    assert err_km < err_rand


def test_quantize_reconstructs_signs_and_gaussian_sanity_number():
    w = torch.randn(512, 2048, generator=torch.Generator().manual_seed(0))
    codebook = positive_orthant_kmeans(sph_directions([w]), 64, iterations=10, seed=0)
    codes = sph_quantize(w, codebook, radius_bits=2, group_size=256)
    w_hat = sph_dequantize(codes, codebook)
    # signs are stored exactly: every nonzero reconstructed weight has its original sign
    nz = w_hat != 0
    assert (torch.sign(w_hat[nz]) == torch.sign(w[nz])).all()
    # METHODS.md sanity number: K=64, b_r=2 ~0.110 on a Gaussian 512 x 2048 matrix
    assert relative_error(w, w_hat) == pytest.approx(0.110, abs=0.01)


@pytest.mark.parametrize("k,radius_bits,group", [(64, 2, 256), (256, 3, 128), (4096, 4, 64)])
def test_pack_unpack_identity(k, radius_bits, group):
    w = _weight(1, (24, 256))
    codebook = torch.nn.functional.normalize(torch.rand(k, 8, generator=torch.Generator().manual_seed(2)), dim=1)
    codes = sph_quantize(w, codebook, radius_bits, group)
    stream = sph_pack(codes)
    signs, index, radius = sph_unpack_rows(stream, 256, k, radius_bits, 0, 24)
    assert torch.equal(signs, codes.signs) and torch.equal(index, codes.index)
    assert torch.equal(radius, codes.radius_code)
    part = sph_unpack_rows(stream, 256, k, radius_bits, 5, 9)
    assert torch.equal(part[1], codes.index[5:9])
    decoded = sph_decode(signs, index, radius, codes.radius_min, codes.radius_step, codebook, group)
    assert torch.equal(decoded, sph_dequantize(codes, codebook))
    bits = codes.storage()
    assert stream.numel() - 8 == math.ceil(bits.payload_bits / 8)


def test_bits_per_weight_arithmetic():
    # (8 + log2 K + b_r) / 8 + 2 fp16 per group of radii; the codebook is shared data
    assert sph_bits(512, 2048, 64, 2, 256).bits_per_weight == pytest.approx(2.0 + 32 / 256)
    assert sph_bits(512, 2048, 256, 3, 256).bits_per_weight == pytest.approx(2.5)
    assert sph_bits(512, 2048, 2048, 4, 256).bits_per_weight == pytest.approx(3.0)
    assert sph_bits(512, 2048, 4096, 4, 128).bits_per_weight == pytest.approx(3.0 + 0.25)
    s = sph_bits(10, 576, 256, 4, 256)  # 72 vectors per row -> 3 radius groups of 32 (ragged)
    assert s.payload_bits == 10 * 72 * 20 and s.scale_bits == 10 * 3 * 32 and s.shared_bits == 256 * 8 * 16
    with pytest.raises(ValueError, match="codebook_size"):
        sph_bits(8, 64, 100, 2, 64)
    with pytest.raises(ValueError, match="in_features"):
        sph_bits(8, 60, 64, 2, 64)


@pytest.mark.parametrize("loss", ["reconstruction", "hessian"])
def test_finetuned_codewords_stay_on_the_positive_sphere_and_do_not_hurt(loss):
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(64, 128, generator=gen), torch.randn(32, 256, generator=gen) * 3]
    hessians = None
    if loss == "hessian":
        hessians = []
        for w in weights:
            x = torch.randn(512, w.shape[1], generator=gen) * torch.linspace(0.2, 2.0, w.shape[1])
            hessians.append(x.T @ x / 512)
    codebook = positive_orthant_kmeans(sph_directions(weights), 32, iterations=3, seed=0)
    tuned, history = finetune_codebook(codebook, weights, 3, 64, hessians, loss, rounds=2, steps=40, lr=0.05)
    torch.testing.assert_close(tuned.norm(dim=1), torch.ones(32))
    assert (tuned >= 0).all()
    assert len(history) == 3 and min(history[1:]) <= history[0]
    assert not torch.equal(tuned, codebook)  # fine-tuning moved the codewords


def test_finetune_needs_hessians_for_hessian_loss():
    w = _weight()
    codebook = positive_orthant_kmeans(sph_directions([w]), 16, iterations=1)
    with pytest.raises(ValueError, match="hessians"):
        finetune_codebook(codebook, [w], 2, 64, loss="hessian")


@pytest.mark.parametrize("codebook_size", [64, 4096])
def test_assign_codewords_matches_plain_argmax_with_ties(codebook_size: int) -> None:
    """The blocked max (K >= 256) returns exactly ``argmax(U C^T)``, first index on ties, across chunk edges."""
    g = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(1000, 8, generator=g).abs(), dim=1)
    codebook = torch.nn.functional.normalize(torch.randn(codebook_size, 8, generator=g).abs(), dim=1)
    codebook[3] = codebook[codebook_size - 2]                         # duplicate codewords: exact ties
    directions[:10] = codebook[codebook_size - 2]                     # vectors sitting on the tied pair
    expected = (directions @ codebook.T).argmax(1)
    assert torch.equal(assign_codewords(directions, codebook, chunk=300), expected)
    assert torch.equal(assign_codewords(directions, codebook)[:10], torch.full((10,), 3))
