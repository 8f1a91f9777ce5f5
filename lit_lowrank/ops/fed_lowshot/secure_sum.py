"""Secure summation with pairwise additive masks (Bonawitz et al., 2017; no dropouts).

Each client ``i`` encodes its float vector in fixed point as integers mod ``2⁶⁴`` and adds,
for every other client ``j``, a mask ``m_ij = PRG(seed_ij)`` with sign ``+`` if ``i < j`` and
``−`` otherwise. The seed is agreed pairwise by Diffie-Hellman over the RFC 3526 2048-bit
MODP group (standard library only), so the server that relays public keys cannot compute
it. The masks cancel in the sum, so the server learns ``Σ_i x_i`` and nothing else: each
masked vector on its own is uniform on ``Z_{2⁶⁴}^D``. Dropout recovery (secret-shared keys,
SecAgg+) is what Flower's ``SecAggPlusWorkflow`` adds on the Flower path; the in-process
federation assumes every client answers (decided: the embedded default has no dropouts).

.. code-block:: python

    from lit_lowrank.ops.fed_lowshot.secure_sum import (dh_keypair, encode_fixed_point, mask_vector, shared_seed,
                                            decode_fixed_point, sum_masked)

    keys = {i: dh_keypair(seed=i) for i in range(3)}                       # (secret, public)
    masked = []
    for i, x in enumerate(vectors):
        seeds = {j: shared_seed(keys[i][0], keys[j][1]) for j in keys if j != i}
        masked.append(mask_vector(encode_fixed_point(x), i, seeds))
    total = decode_fixed_point(sum_masked(masked))                          # = sum(vectors)
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

#: RFC 3526 group 14 (2048-bit MODP) prime; generator 2.
MODP_PRIME = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
MODP_GENERATOR = 2
#: Private exponent size in bits.
DH_EXPONENT_BITS = 320
#: Default fixed-point fraction bits: resolution 2⁻²⁰, |total| < 2⁴³ ≈ 8.8e12.
FRAC_BITS = 20


def dh_keypair(seed: int | None = None) -> tuple[int, int]:
    """A Diffie-Hellman ``(secret, public)`` pair; ``seed`` only for reproducible tests.

    .. code-block:: python

        secret, public = dh_keypair()
    """
    # 320-bit exponents: > 2x the ~112-bit strength of the 2048-bit group (RFC 3526 §8 / RFC 7919
    # guidance) and ~6x faster than full-size exponents for the K(K-1) pairwise exponentiations
    if seed is None:
        secret = secrets.randbits(DH_EXPONENT_BITS) | (1 << (DH_EXPONENT_BITS - 1))
    else:
        digest = hashlib.sha512(f"lit_lowrank-dh-{seed}".encode()).digest()
        secret = int.from_bytes(digest[: DH_EXPONENT_BITS // 8], "big") | (1 << (DH_EXPONENT_BITS - 1))
    return secret, pow(MODP_GENERATOR, secret, MODP_PRIME)


def shared_seed(secret: int, peer_public: int) -> bytes:
    """The 32-byte pairwise seed ``SHA-256(g^(ab) mod p)`` (same bytes on both sides).

    .. code-block:: python

        assert shared_seed(a_secret, b_public) == shared_seed(b_secret, a_public)
    """
    if not 1 < peer_public < MODP_PRIME - 1:
        raise ValueError("shared_seed: `peer_public` is not a valid group element")
    return hashlib.sha256(pow(peer_public, secret, MODP_PRIME).to_bytes(256, "big")).digest()


def encode_fixed_point(values: np.ndarray, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """Floats to integers mod ``2⁶⁴`` (two's complement fixed point, ``round(x·2^frac_bits)``).

    .. code-block:: python

        encode_fixed_point(np.array([1.5, -2.0]))
    """
    x = np.asarray(values, dtype=np.float64)
    limit = 2.0 ** (63 - frac_bits)
    if not np.all(np.isfinite(x)) or np.abs(x).max(initial=0.0) >= limit:
        raise ValueError(f"encode_fixed_point: values must be finite with |x| < 2^{63 - frac_bits} = {limit:.3g}")
    return np.round(x * 2.0**frac_bits).astype(np.int64).view(np.uint64)


def decode_fixed_point(encoded: np.ndarray, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """Integers mod ``2⁶⁴`` back to floats (inverse of :func:`encode_fixed_point`).

    .. code-block:: python

        decode_fixed_point(encode_fixed_point(np.array([0.25])))   # array([0.25])
    """
    return np.asarray(encoded, dtype=np.uint64).view(np.int64).astype(np.float64) / 2.0**frac_bits


def pair_mask(seed: bytes, size: int) -> np.ndarray:
    """The pseudo-random uniform mask in ``Z_{2⁶⁴}^size`` expanded from a pairwise seed."""
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
    return rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False)


def mask_vector(encoded: np.ndarray, client_id: int, peer_seeds: dict[int, bytes]) -> np.ndarray:
    """Add ``+m_ij`` for peers ``j > i`` and ``−m_ij`` for ``j < i`` (all mod ``2⁶⁴``).

    Args:
        encoded: ``(D,)`` uint64 vector from :func:`encode_fixed_point`.
        client_id: this client's id ``i``.
        peer_seeds: ``{j: seed_ij}`` for every other participating client.

    .. code-block:: python

        masked = mask_vector(encode_fixed_point(x), 0, {1: seed_01, 2: seed_02})
    """
    out = np.asarray(encoded, dtype=np.uint64).ravel().copy()
    with np.errstate(over="ignore"):
        for peer, seed in sorted(peer_seeds.items()):
            if peer == client_id:
                raise ValueError(f"mask_vector: client {client_id} listed itself among its peers")
            mask = pair_mask(seed, out.size)
            out = out + mask if client_id < peer else out - mask  # uint64 arithmetic wraps mod 2^64
    return out


def sum_masked(masked: list[np.ndarray]) -> np.ndarray:
    """Sum of masked vectors mod ``2⁶⁴``: the masks cancel, leaving the encoded total.

    .. code-block:: python

        total = decode_fixed_point(sum_masked(masked_vectors))
    """
    if not masked:
        raise ValueError("sum_masked: needs at least one masked vector")
    total = np.zeros_like(np.asarray(masked[0], dtype=np.uint64))
    with np.errstate(over="ignore"):
        for vec in masked:
            total = total + np.asarray(vec, dtype=np.uint64)
    return total
