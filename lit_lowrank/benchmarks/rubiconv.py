"""RubiConv benchmark: exact boundary-respecting packed long convolution vs its baselines,
and a Hyena LM trained on packed data with and without boundary respect.

**Op.** Packs of ``N`` tokens with ``H`` channels whose document lengths follow a Zipf law
(exponent 1.5, capped at N/16) plus three long documents (N/4, N/8, N/16), shuffled; one
causal filter of ``L`` taps per channel (``L = N``, Hyena's filter as long as the pack, and
one setting with ``L`` shorter than the long documents, which exercises the overlap-save
pieces). Each method runs forward + backward (``y.backward(g)`` for a fixed random ``g``),
interleaved A B A B, median time; rows give the ratio to RubiConv and the maximum error
``max|y - y_ref| / max|y_ref|`` against a float64 per-document FFT reference (the tests
check that reference path against the direct ``O(N L)`` sum). Methods:

- ``rubiconv``: :func:`lit_lowrank.ops.packed_long_conv` (plan included in the time);
- ``per_document_loop``: one FFT convolution per document (kernel spectra cached per size);
- ``pad_to_longest``: every document zero-padded to the longest and convolved as a batch,
  in groups of documents that fit 64 MiB; its time is measured on the first groups and
  scaled linearly to all documents (every document costs the same padded FFT; each
  row's ``note`` says how many documents were timed);
- ``whole_pack_fft``: one FFT over the whole pack — fast but wrong: it leaks across
  documents, its error column is the leakage;
- ``attention_sdpa``: scaled-dot-product attention with a block-diagonal causal mask
  (q = k = v = x, heads of 64 channels), computed in 1024-query tiles whose keys start at
  the tile's first document (a dense N x N mask does not fit at N = 32k); a different
  operator, so no error column;
- ``attention_per_document``: the same attention run document by document with
  ``is_causal`` (variable-length attention without the mask's wasted tiles); the claim is
  against ``attention_best``, the faster of the two at each size.

**LM.** Two :class:`~lit_lowrank.tasks.CausalLMModule` with the ``rubiconv_hyena`` model,
same seed and batch order, on packed byte-level windows of the Lee corpus:
``respect_boundaries=True`` (RubiConv) and ``False`` (whole-window convolution, same code).
Seeds ``seed .. seed + 2`` (quick; five in the full run) change the initialisation and batch
order of both alike; rows give each seed and the means, with the paired gap to RubiConv
(mean and 95% half-width over seeds). Their steps are interleaved for tokens/s; validation loss is reported as trained (packed
windows) and per document (boundaries respected at evaluation, i.e. a document alone). The
doc-alone check: the largest logit difference between a packed document and the same
document run alone. Quick: d = 64, windows of 512, batch 8, 150 steps; full: d = 128,
windows of 1024, 600 steps (2 layers, AdamW 3e-3 with cosine decay to 3e-4, gradient norm
clipped at 1).

**Claims** (the protocol of :mod:`lit_lowrank.benchmarks.harness`): RubiConv faster than each
boundary-respecting baseline — the geometric-mean time ratio over pack sizes, each size's ratio
the median of paired interleaved rounds; the LM's validation loss with vs without boundaries
over paired seeds. **Premises**: a baseline leaves room for a batched exact method only if it is
slower than one batched FFT over the whole pack with no boundary work (boundaries ignored); the
LM's boundaries can only matter if the leaky model's loss depends on the neighbouring documents
(its loss on documents alone differs from its loss on packed windows). **Competitor** of the
LM's as-trained claim: the leaky model with boundaries respected at evaluation only (no
retraining). **Control**: RubiConv timed against a second identical call (A/A), which must not
look faster. Exactness, the whole-pack leak and the doc-alone invariance hold by
construction and are tests (``tests/ops/test_rubiconv.py``, ``tests/models/test_hyena_lm.py``,
``tests/benchmarks/test_rubiconv_baselines.py``); their measured errors stay in the rows.

Quick mode uses N in {4k, 16k} (the three 32k settings add about 3 minutes on this CPU);
the full mode adds them and trains the LM longer. One thread: on a shared
2-core machine two threads per op spin-wait far longer than they compute.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.benchmarks._timing import interleaved_samples
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, per_unit, premise
from lit_lowrank.ops.rubiconv import packed_long_conv

#: (H, N, L) settings; L = None means L = N.
QUICK_SIZES: list[tuple[int, int, int | None]] = [(64, 4096, None), (256, 4096, None), (64, 16384, None),
                                                   (256, 16384, None), (64, 16384, 1024)]
FULL_SIZES: list[tuple[int, int, int | None]] = [(h, n, None) for n in (4096, 16384, 32768) for h in (64, 256)] + [
    (256, 32768, 2048)]
PAD_GROUP_FLOATS = 1 << 24  # 64 MiB of float32 per padded group


def zipf_document_lengths(num_tokens: int, rng: np.random.Generator, exponent: float = 1.5,
                          long_fractions: tuple[float, ...] = (1 / 4, 1 / 8, 1 / 16)) -> list[int]:
    """Document lengths summing to ``num_tokens``: a few long documents plus Zipf(``exponent``)
    lengths capped at ``num_tokens / 16``, in random order."""
    longs = [max(1, int(num_tokens * f)) for f in long_fractions]
    rest, lengths = num_tokens - sum(longs), []
    while rest > 0:
        n = int(min(rng.zipf(exponent), num_tokens // 16, rest))
        lengths.append(n)
        rest -= n
    lengths += longs
    rng.shuffle(lengths)
    return lengths


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def per_document_loop(x: Tensor, kernel: Tensor, offsets: list[int]) -> Tensor:
    """One FFT convolution per document on the channels-first pack (kernel spectra cached per size)."""
    x_cf, taps_max, spectra, outs = x.T.contiguous(), kernel.shape[1], {}, []
    for lo, hi in itertools.pairwise(offsets):
        n = hi - lo
        size = _pow2(n + min(n, taps_max) - 1)
        if size not in spectra:
            spectra[size] = torch.fft.rfft(kernel[:, : min(taps_max, n if size == 1 else size // 2)], n=size)
        outs.append(torch.fft.irfft(torch.fft.rfft(x_cf[:, lo:hi], n=size) * spectra[size], n=size)[:, :n])
    return torch.cat(outs, dim=1).T


def whole_pack_fft(x: Tensor, kernel: Tensor) -> Tensor:
    """One causal FFT convolution over the whole pack: ignores documents (leaks across them)."""
    n, taps = x.shape[0], min(kernel.shape[1], x.shape[0])
    size = _pow2(n + taps - 1)
    spectrum = torch.fft.rfft(x.T, n=size) * torch.fft.rfft(kernel[:, :taps], n=size)
    return torch.fft.irfft(spectrum, n=size)[:, :n].T


def _pad_groups(offsets: list[int], channels: int, kernel_len: int) -> tuple[list[list[int]], int]:
    lengths = np.diff(offsets)
    longest = int(lengths.max())
    size = _pow2(longest + min(longest, kernel_len) - 1)
    per_group = max(1, PAD_GROUP_FLOATS // (channels * size))
    docs = list(range(len(lengths)))
    return [docs[i : i + per_group] for i in range(0, len(docs), per_group)], size


def pad_to_longest_group(x_cf: Tensor, kernel: Tensor, offsets: list[int], docs: list[int], size: int) -> Tensor:
    """Documents ``docs`` zero-padded to the longest document, convolved as one ``(H, D, P)`` batch.

    Args:
        x_cf: ``(H, N + 1)`` channels-first pack with a zero last column (the padding).

    Returns:
        The concatenated outputs of those documents, ``(sum n_d, H)``.
    """
    longest = max(offsets[d + 1] - offsets[d] for d in range(len(offsets) - 1))
    starts = torch.tensor([offsets[d] for d in docs])
    lengths = torch.tensor([offsets[d + 1] - offsets[d] for d in docs])
    col = torch.arange(longest)
    valid = col[None, :] < lengths[:, None]
    index = torch.where(valid, starts[:, None] + col[None, :], x_cf.shape[1] - 1)
    xg = x_cf.index_select(1, index.flatten()).view(x_cf.shape[0], len(docs), longest)
    taps = min(kernel.shape[1], longest)
    y = torch.fft.irfft(torch.fft.rfft(xg, n=size) * torch.fft.rfft(kernel[:, :taps], n=size)[:, None], n=size)
    return y[:, :, :longest].flatten(1)[:, valid.flatten()].T


def block_diagonal_attention(x: Tensor, offsets: list[int], tile: int = 1024) -> Tensor:
    """SDPA with a block-diagonal causal mask over the pack, in query tiles (q = k = v = x)."""
    n, channels = x.shape
    head_dim = min(64, channels)
    heads = channels // head_dim
    qkv = x.T.reshape(heads, head_dim, n).transpose(1, 2)[None]             # (1, heads, N, d)
    lengths = torch.tensor(np.diff(offsets))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    doc_start = torch.tensor(offsets[:-1])[doc]
    outs = []
    for lo in range(0, n, tile):
        hi = min(n, lo + tile)
        key_lo = int(doc_start[lo])  # keys before the tile's first document are masked anyway: skip them
        rows, cols = torch.arange(lo, hi)[:, None], torch.arange(key_lo, hi)[None, :]
        mask = (doc[lo:hi, None] == doc[None, key_lo:hi]) & (rows >= cols)
        keys = qkv[:, :, key_lo:hi]
        outs.append(F.scaled_dot_product_attention(qkv[:, :, lo:hi], keys, keys, attn_mask=mask))
    return torch.cat(outs, dim=2)[0].transpose(1, 2).reshape(channels, n).T


def per_document_attention(x: Tensor, offsets: list[int]) -> Tensor:
    """Causal SDPA run document by document (``is_causal``, no mask): variable-length attention as
    flash-attention's varlen kernels compute it, without the block mask's wasted tiles."""
    n, channels = x.shape
    head_dim = min(64, channels)
    heads = channels // head_dim
    qkv = x.T.reshape(heads, head_dim, n).transpose(1, 2)[None]             # (1, heads, N, d)
    outs = [F.scaled_dot_product_attention(qkv[:, :, lo:hi], qkv[:, :, lo:hi], qkv[:, :, lo:hi], is_causal=True)
            for lo, hi in itertools.pairwise(offsets)]
    return torch.cat(outs, dim=2)[0].transpose(1, 2).reshape(channels, n).T


def _max_rel_error(y: Tensor, ref: Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


def _op_rows(channels: int, num_tokens: int, kernel_len: int, seed: int, repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed + num_tokens + channels + kernel_len)
    lengths = zipf_document_lengths(num_tokens, rng)
    offsets = [0, *np.cumsum(lengths).tolist()]
    cu_seqlens = torch.tensor(offsets)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, channels, generator=gen).requires_grad_()
    # a decaying random filter, as Hyena's modulated implicit filters are
    decay = torch.exp(-torch.arange(kernel_len) / (kernel_len / 8))
    kernel = (torch.randn(channels, kernel_len, generator=gen) * decay / math.sqrt(kernel_len / 8)).requires_grad_()
    grad_y = torch.randn(num_tokens, channels, generator=gen)
    with torch.no_grad():
        reference = per_document_loop(x.double(), kernel.double(), offsets)
    groups, pad_size = _pad_groups(offsets, channels, kernel_len)
    timed_groups = groups[: min(len(groups), 2)]
    timed_docs = sum(len(g) for g in timed_groups)
    pad_outputs: dict[str, Tensor] = {}

    def fwd_bwd(fn: Any) -> Any:
        def run() -> None:
            x.grad = kernel.grad = None
            fn().backward(grad_y)
        return run

    def pad_run() -> float:
        x.grad = kernel.grad = None
        start = time.perf_counter()
        x_cf = F.pad(x.T, (0, 1)).detach().requires_grad_()  # once per pass; groups read it
        once = time.perf_counter() - start
        outs = []
        for docs in timed_groups:
            y = pad_to_longest_group(x_cf, kernel, offsets, docs, pad_size)
            token_index = torch.cat([torch.arange(offsets[d], offsets[d + 1]) for d in docs])
            y.backward(grad_y[token_index])
            outs.append((token_index, y.detach()))
        groups_time = time.perf_counter() - start - once
        start = time.perf_counter()
        x.grad = x_cf.grad[:, :-1].T.contiguous()
        once += time.perf_counter() - start
        pad_outputs["y"] = outs  # type: ignore[assignment]
        # every document costs the same padded FFT: scale the groups' time to all documents
        return once + groups_time * len(lengths) / timed_docs

    fns = {
        "rubiconv": fwd_bwd(lambda: packed_long_conv(x, kernel, cu_seqlens)),
        # the same call again: the A/A control (timing noise must not look like a speed-up)
        "rubiconv_again": fwd_bwd(lambda: packed_long_conv(x, kernel, cu_seqlens)),
        "per_document_loop": fwd_bwd(lambda: per_document_loop(x, kernel, offsets)),
        "pad_to_longest": pad_run,
        "whole_pack_fft": fwd_bwd(lambda: whole_pack_fft(x, kernel)),
        "attention_sdpa": fwd_bwd(lambda: block_diagonal_attention(x, offsets)),
        "attention_per_document": fwd_bwd(lambda: per_document_attention(x, offsets)),
    }
    samples = interleaved_samples(fns, repeats=repeats, warmup=1)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    with torch.no_grad():
        errors = {
            "rubiconv": _max_rel_error(packed_long_conv(x, kernel, cu_seqlens), reference),
            "rubiconv_again": _max_rel_error(packed_long_conv(x, kernel, cu_seqlens), reference),
            "per_document_loop": _max_rel_error(per_document_loop(x, kernel, offsets), reference),
            "whole_pack_fft": _max_rel_error(whole_pack_fft(x, kernel), reference),
        }
        idx = torch.cat([t for t, _ in pad_outputs["y"]])  # type: ignore[index]
        errors["pad_to_longest"] = _max_rel_error(torch.cat([y for _, y in pad_outputs["y"]]), reference[idx])  # type: ignore[index]
    rows = []
    for method, seconds in medians.items():
        rows.append({
            "part": "op", "method": method, "H": channels, "N": num_tokens, "L": kernel_len, "documents": len(lengths),
            "longest_doc": max(lengths), "fwd_bwd_ms": seconds * 1e3,
            # median over rounds of the paired per-round ratio (both timed back to back)
            "ratio_to_rubiconv": statistics.median(t / r for t, r in zip(samples[method], samples["rubiconv"])),
            "max_rel_error": errors.get(method),
            "note": (f"extrapolated from {timed_docs}/{len(lengths)} documents" if method == "pad_to_longest"
                     else "leaks across documents" if method == "whole_pack_fft"
                     else "A/A control: RubiConv timed again" if method == "rubiconv_again"
                     else "different operator: time only" if method.startswith("attention") else ""),
        })
    # the attention baseline at its best: the faster of the two implementations at this size
    best = min((r for r in rows if r["method"].startswith("attention")), key=lambda r: r["ratio_to_rubiconv"])
    rows.append({**best, "method": "attention_best", "note": f"the faster attention: {best['method']}"})
    return rows


def _lm_rows(quick: bool, seed: int) -> list[dict[str, Any]]:
    """Per-seed rows and, per method, the mean over seeds with the paired gap to RubiConv."""
    seeds = [seed + i for i in range(3 if quick else 5)]
    per_seed = [row for s in seeds for row in _lm_run(quick, s)]
    rows = [{**row, "part": "lm_seed"} for row in per_seed]
    for method in ("rubiconv", "leaky_whole_pack"):
        mine = [r for r in per_seed if r["method"] == method]
        ref = [r for r in per_seed if r["method"] == "rubiconv"]
        summary = {"part": "lm", "method": method, "respect_boundaries": mine[0]["respect_boundaries"],
                   "steps": mine[0]["steps"], "seeds": len(seeds)}
        for key in ("tokens_per_s", "val_loss", "val_loss_per_document"):
            summary[key] = statistics.fmean(r[key] for r in mine)
        for key in ("val_loss", "val_loss_per_document"):
            # paired over seeds: this method minus RubiConv, mean and 95% half-width
            gaps = [m[key] - r[key] for m, r in zip(mine, ref)]
            summary[f"{key}_minus_rubiconv"] = statistics.fmean(gaps)
            summary[f"{key}_minus_rubiconv_ci95"] = 1.96 * statistics.stdev(gaps) / math.sqrt(len(gaps))
        summary["doc_alone_max_logit_diff"] = max(r["doc_alone_max_logit_diff"] for r in mine)
        rows.append(summary)
    return rows


def _lm_run(quick: bool, seed: int, steps: int | None = None) -> list[dict[str, Any]]:
    from lit_lowrank.datamodules import PackedTextDataModule
    from lit_lowrank.tasks import CausalLMModule

    default_steps, hidden, seq_len, batch_size = (150, 64, 512, 8) if quick else (600, 128, 1024, 8)
    steps = steps or default_steps
    data = PackedTextDataModule(corpus="lee", tokenizer="byte", seq_len=seq_len, batch_size=batch_size, seed=seed)
    data.setup("fit")
    config = {"model_type": "rubiconv_hyena", "hidden_size": hidden, "num_layers": 2, "max_seq_len": seq_len}
    modules, optimizers, schedules, step_times = {}, {}, {}, {}
    for name, respect in (("rubiconv", True), ("leaky_whole_pack", False)):
        torch.manual_seed(seed)
        modules[name] = CausalLMModule(model_config=config, respect_boundaries=respect)
        optimizers[name] = torch.optim.AdamW(modules[name].parameters(), lr=3e-3, weight_decay=0.01)
        # cosine decay to 10% and clipping: the end point, not a late loss spike, is compared
        schedules[name] = torch.optim.lr_scheduler.CosineAnnealingLR(optimizers[name], steps, eta_min=3e-4)
        step_times[name] = []
    order = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(data.train_set, batch_size=batch_size, shuffle=True, generator=order,
                                         drop_last=True)
    done = 0
    while done < steps:
        for batch in loader:
            for name, module in modules.items():  # the same batch, interleaved: side-by-side timing
                start = time.perf_counter()
                loss = module.step(batch)["loss"]
                optimizers[name].zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
                optimizers[name].step()
                schedules[name].step()
                step_times[name].append(time.perf_counter() - start)
            done += 1
            if done == steps:
                break
    rows = []
    val_batches = list(data.val_dataloader())
    for name, module in modules.items():
        module.eval()
        trained_as = module.respect_boundaries
        losses = {}
        for label, respect in (("val_loss", trained_as), ("val_loss_per_document", True)):
            module.respect_boundaries = respect
            total = count = 0.0
            with torch.no_grad():
                for batch in val_batches:
                    n = int((batch["labels"] != -100).sum())
                    total += float(module.step(batch)["loss"]) * n
                    count += n
            losses[label] = total / count
        module.respect_boundaries = trained_as
        times = sorted(step_times[name][5:])  # skip warm-up steps
        rows.append({
            "part": "lm", "method": name, "seed": seed, "respect_boundaries": trained_as, "steps": steps,
            "tokens_per_s": batch_size * seq_len / times[len(times) // 2], **losses,
            "doc_alone_max_logit_diff": _doc_alone_gap(module, val_batches[0]),
        })
    return rows


def _doc_alone_gap(module: Any, batch: dict[str, Tensor]) -> float:
    """Largest |logit| difference between documents inside packed rows and each document run alone."""
    with torch.no_grad():
        packed = module(batch["input_ids"], batch["position_ids"], batch["doc_ids"]).logits
        gap = 0.0
        for row in range(batch["input_ids"].shape[0]):
            doc_ids = batch["doc_ids"][row]
            change = torch.nonzero(doc_ids[1:] != doc_ids[:-1]).flatten() + 1
            bounds = [0, *change.tolist(), doc_ids.numel()]
            for lo, hi in itertools.pairwise(bounds):
                alone = module(batch["input_ids"][row : row + 1, lo:hi]).logits
                gap = max(gap, float((packed[row : row + 1, lo:hi] - alone).abs().max()))
    return gap


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(1)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    repeats = 3 if quick else 5
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for channels, num_tokens, kernel_len in sizes:
        rows += _op_rows(channels, num_tokens, kernel_len or num_tokens, seed, repeats)
    op_seconds = time.perf_counter() - start
    rows += _lm_rows(quick, seed)

    op = [{**r, "size": f"H{r['H']}-N{r['N']}-L{r['L']}"} for r in rows if r["part"] == "op"]
    seeds = [r for r in rows if r["part"] == "lm_seed"]
    paper = ("RubiConv achieves significant speedups over both attention and standard FFT-based baselines "
             "(boundary-respecting convolution on packed sequences)")

    def speedup(baseline: str, text: str, ctl: bool = False) -> dict[str, Any]:
        ratios, ones, sizes = paired(op, "ratio_to_rubiconv", {"method": baseline}, {"method": "rubiconv"}, unit="size")
        return claim(text, paper=paper if not ctl else "(control: the same op timed twice)",
                     quantity=f"forward+backward time({baseline}) / time(rubiconv), geometric mean over pack sizes "
                              "(each size: median of paired interleaved rounds)",
                     values=ratios, baseline=ones, compare="ratio", unit="size", units=sizes, target=1.0, op=">",
                     name=None if ctl else f"faster_than_{baseline}", requires=None if ctl else f"room_{baseline}")

    def room(baseline: str) -> dict[str, Any]:
        # both ratios are to RubiConv's time in the same round: their ratio is time(baseline) / time(whole pack)
        slow, floor, sizes = paired(op, "ratio_to_rubiconv", {"method": baseline}, {"method": "whole_pack_fft"},
                                    unit="size")
        return premise(f"room_{baseline}", f"{baseline} is slower than one FFT over the whole pack",
                       needs="a baseline slower than one batched FFT with no boundary work (the whole pack, "
                             "boundaries ignored): room for a batched exact method to be faster",
                       quantity=f"time({baseline}) / time(whole-pack FFT), geometric mean over pack sizes",
                       values=slow, baseline=floor, compare="ratio", unit="size", units=sizes, target=1.0, op=">")

    baselines = {"per_document_loop": "RubiConv is faster than the per-document FFT loop",
                 "pad_to_longest": "RubiConv is faster than pad-to-longest FFT",
                 "attention_best": "RubiConv is faster than causal SDPA attention at its best (block mask or "
                                   "per-document calls, the faster per size)"}
    claims = [speedup(b, text) for b, text in baselines.items()]
    premises = [room(b) for b in baselines]
    lm_paper = ("(METHODS.md experiment: a Hyena-style LM trained on packed data with and without boundary "
                "respect; the abstract gives no number)")
    alone_by = per_unit(seeds, "val_loss_per_document", method="leaky_whole_pack")
    packed_by = per_unit(seeds, "val_loss", method="leaky_whole_pack")
    units = sorted(alone_by)
    alone, packed = [alone_by[u] for u in units], [packed_by[u] for u in units]
    premises.append(premise(
        "leakage_matters", "the leaky model's loss depends on the neighbouring documents",
        needs="cross-document context that changes the leaky model's loss: otherwise cutting it cannot matter",
        quantity="val_loss_per_document(leaky) - val_loss(leaky, packed windows), nats/token, paired seeds",
        values=alone, baseline=packed, units=units, target=0.0, op=">"))
    for key, where, name in (("val_loss", "as trained (packed windows)", "lm_as_trained"),
                             ("val_loss_per_document", "on documents alone", "lm_documents_alone")):
        leaky, ours, units = paired(seeds, key, {"method": "leaky_whole_pack"}, {"method": "rubiconv"})
        claims.append(claim(
            f"LM: respecting boundaries lowers validation loss {where}", paper=lm_paper,
            quantity=f"{key}(whole-pack, leaky) - {key}(RubiConv), nats/token, paired seeds",
            values=leaky, baseline=ours, units=units, target=0.0, op=">", name=name, requires="leakage_matters"))
    competitors = [competitor(
        "lm_as_trained", "boundaries respected at evaluation only lower the leaky model's loss as much",
        competitor="the leaky model, boundaries respected at evaluation only (no retraining)",
        quantity="val_loss(leaky, packed) - val_loss_per_document(leaky), nats/token, paired seeds",
        values=packed, baseline=alone, units=units, target=0.0, op=">")]
    controls = [speedup("rubiconv_again", "RubiConv is faster than itself (A/A: the same call timed twice)", ctl=True)]
    notes = {"threads": torch.get_num_threads(), "op_seconds": round(op_seconds, 1), "repeats": repeats,
             "sizes": "N in {4k, 16k} (quick); 32k in the full run" if quick else "N in {4k, 16k, 32k}",
             "pad_to_longest": "timed on the first <= 2 groups of documents (64 MiB each), scaled to all documents"}
    return BenchmarkResult(rows, claims, controls, notes, premises=premises, competitors=competitors)
