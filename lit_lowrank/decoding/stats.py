"""Per-generation statistics of the speculative-decoding engine (:class:`DecodeStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeStats:
    """Per-generation statistics.

    ``mean_acceptance_length`` (τ) is tokens emitted per target forward after the prefill
    (accepted draft tokens + the bonus token), ``forwards_per_round`` the drafter forward
    passes per round, ``draft_share`` the fraction of decode time spent drafting.
    """

    new_tokens: int = 0
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)
    drafter_forwards: int = 0
    draft_nodes: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return sum(a + 1 for a in self.accepted) / max(self.rounds, 1)

    @property
    def forwards_per_round(self) -> float:
        return self.drafter_forwards / max(self.rounds, 1)

    @property
    def draft_share(self) -> float:
        decode = self.total_seconds - self.prefill_seconds
        return self.draft_seconds / decode if decode > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def acceptance_figure(self, title: str = "") -> Any:
        """Histogram of tokens emitted per round (accepted draft tokens + the bonus token), with τ
        marked — for :func:`lit_lowrank.core.figures.log_figure` (W&B / TensorBoard / PNG)."""
        from lit_lowrank.core.figures import new_figure

        lengths = [a + 1 for a in self.accepted]
        fig, ax = new_figure(5.0, 3.4)
        if lengths:
            edges = [x - 0.5 for x in range(1, max(lengths) + 2)]
            counts, _, bars = ax.hist(lengths, bins=edges, color="tab:blue", rwidth=0.85)
            ax.bar_label(bars, labels=[str(int(c)) for c in counts], fontsize=7)
            ax.axvline(self.mean_acceptance_length, color="tab:red", ls="--", label=f"τ = {self.mean_acceptance_length:.2f}")
            ax.legend(fontsize=8)
        ax.set(xlabel="tokens per target forward (acceptance length)", ylabel="rounds",
               title=title or f"acceptance lengths over {self.rounds} rounds")
        return fig

    def merge(self, other: DecodeStats) -> DecodeStats:
        """Sum of two runs' statistics."""
        return DecodeStats(
            self.new_tokens + other.new_tokens, self.rounds + other.rounds, self.accepted + other.accepted,
            self.drafter_forwards + other.drafter_forwards, self.draft_nodes + other.draft_nodes,
            self.draft_seconds + other.draft_seconds, self.verify_seconds + other.verify_seconds,
            self.prefill_seconds + other.prefill_seconds, self.total_seconds + other.total_seconds,
        )
