"""generate(do_sample=True, multi_token_mode=True) samples from exactly the distribution of plain sampling.

On a Llama with a 6-token vocabulary, the exact joint distribution of the first three new tokens (216 outcomes) is
computed from plain generate()'s own processed scores (temperature, top-k, top-p). Thousands of multi-token samples
are drawn and compared with it by a chi-square goodness-of-fit test. A deliberately biased variant (a rejected draft
is replaced by a sample of p instead of the residual max(p - q, 0)) must fail the same test.
"""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import transformers_mtp
from transformers_mtp import generation_multi_token
from transformers_mtp.generation_acceptance import accept_speculative

VOCAB = 6
PROMPT = torch.tensor([[0, 3, 5, 4]])
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=5, top_p=0.97)
NUM_SAMPLES = 6000


HEADS = {
    "resblock": dict(head_type="resblock"),
    # the shipped design: query extension reading the next token, drafting over a reduced vocabulary (q = 0 outside)
    "qext-token-draft-vocab": dict(head_type="query_extension", head_input="feature_and_token", draft_vocab_size=4),
    # chained heads: draft 2 is sampled from a q that depends on the sampled draft 1
    "qext-sequential-draft-vocab": dict(head_type="query_extension", head_input="sequential", draft_vocab_size=4),
    # the chained drafter: one layer, each draft's q depends on the sampled drafts before it
    "chained-draft-vocab": dict(head_type="chained", draft_vocab_size=4),
}


def peaked_model(heads="resblock"):
    """Random weights scaled up so that p is far from uniform and the heads' q is far from p."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                         eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    base = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        base.lm_head.weight.mul_(8.0)
    model = transformers_mtp.convert(base, num_heads=3, **HEADS[heads])
    with torch.no_grad():
        for param in model.mtp_heads.parameters():
            if param.is_floating_point():
                param.add_(torch.randn(param.shape) * 0.5)
    if model.config.draft_vocab_size:
        model.set_draft_vocabulary([1, 2, 4, 5])
    return model


def next_token_probs(model, prefixes):
    """p(. | prefix) after plain generate()'s own logits processors, for prefixes [N, L]."""
    out = model.generate(prefixes, max_new_tokens=1, return_dict_in_generate=True, output_scores=True,
                         attention_mask=torch.ones_like(prefixes), **SAMPLING)
    return torch.softmax(out.scores[0].double(), dim=-1)


def exact_distribution(model):
    """P(t1, t2, t3) of plain sampling, as a [VOCAB ** 3] vector in itertools.product order."""
    p1 = next_token_probs(model, PROMPT)[0]
    pairs = torch.tensor(list(itertools.product(range(VOCAB), repeat=1)))
    p2 = next_token_probs(model, torch.cat([PROMPT.expand(VOCAB, -1), pairs], dim=1))  # [t1, t2]
    triples = torch.tensor(list(itertools.product(range(VOCAB), repeat=2)))
    p3 = next_token_probs(model, torch.cat([PROMPT.expand(VOCAB**2, -1), triples], dim=1))  # [t1 t2, t3]
    joint = p1[:, None, None] * p2[:, :, None] * p3.view(VOCAB, VOCAB, VOCAB)
    return joint.reshape(-1)


def multi_token_samples(model, num_samples, seed, **kwargs):
    """First three new tokens of `num_samples` multi-token samples (one batched call: rows are independent)."""
    torch.manual_seed(seed)
    prompts = PROMPT.expand(num_samples, -1)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=4, multi_token_mode=True,
                         num_predict_heads=3, return_dict_in_generate=True, **SAMPLING, **kwargs)
    new = out.sequences[:, PROMPT.shape[1] : PROMPT.shape[1] + 3]
    return (new[:, 0] * VOCAB + new[:, 1]) * VOCAB + new[:, 2], out.multi_token_stats


def chi_square_p_value(outcomes, expected_probs, min_expected=5.0):
    """Pearson's goodness-of-fit test; outcomes with fewer than `min_expected` expected counts are pooled."""
    counts = torch.bincount(outcomes, minlength=expected_probs.numel()).double()
    expected = expected_probs * outcomes.numel()
    assert counts[expected == 0].sum() == 0, "an outcome plain sampling never produces was drawn"
    small = expected < min_expected
    counts = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    p_value = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.double), statistic / 2)
    return float(statistic), dof, float(p_value)


@pytest.fixture(scope="module", params=list(HEADS))
def model_and_exact(request):
    model = peaked_model(request.param)
    return model, exact_distribution(model)


def test_exact_distribution_is_plain_sampling(model_and_exact):
    """The reference itself: plain generate(do_sample=True) agrees with it (so the test compares like with like)."""
    model, exact = model_and_exact
    torch.manual_seed(1)
    prompts = PROMPT.expand(NUM_SAMPLES, -1)
    plain = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=3, **SAMPLING)
    new = plain[:, PROMPT.shape[1] :]
    statistic, dof, p_value = chi_square_p_value((new[:, 0] * VOCAB + new[:, 1]) * VOCAB + new[:, 2], exact)
    print(f"plain sampling: chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > 1e-3


def test_speculative_sampling_matches_plain_sampling(model_and_exact):
    model, exact = model_and_exact
    outcomes, stats = multi_token_samples(model, NUM_SAMPLES, seed=2)
    statistic, dof, p_value = chi_square_p_value(outcomes, exact)
    print(f"speculative sampling: chi2={statistic:.1f} dof={dof} p={p_value:.3f} acceptance={stats.head_acceptance}")
    assert p_value > 1e-3
    # the drafts were really used, and really rejected sometimes: the residual path was exercised
    # (every row's first verify pass checks 2 drafts; rows that rejected early check more in a second pass)
    assert stats.head_proposed[0] >= NUM_SAMPLES and stats.head_proposed[1] >= NUM_SAMPLES
    assert 0.05 < stats.head_acceptance[0] < 0.95 and 0.02 < stats.head_acceptance[1] < 0.95


def test_context_lookup_drafts_keep_the_distribution(model_and_exact):
    """Drafts copied from the context have a one-hot q: kept with probability p(d), else resampled from p without d."""
    model, exact = model_and_exact
    outcomes, stats = multi_token_samples(model, NUM_SAMPLES, seed=4, draft_lookup_ngram=1, draft_lookup_num_tokens=3)
    statistic, dof, p_value = chi_square_p_value(outcomes, exact)
    print(f"speculative sampling with context lookup: chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > 1e-3


def test_biased_variant_fails_the_test(model_and_exact, monkeypatch):
    """Resampling a rejected draft from p instead of the residual is the classic bug; the test must catch it."""
    model, exact = model_and_exact
    original_multinomial = torch.multinomial

    def biased_accept(scores, drafts, draft_probs):
        if drafts.shape[0] == 0:
            return accept_speculative(scores, drafts, draft_probs)
        probs = torch.softmax(scores.float(), dim=-1)
        for j in range(drafts.shape[0]):
            token = drafts[j]
            if torch.rand(()) * draft_probs[j, token] < probs[j, token]:
                continue
            return torch.cat([drafts[:j], original_multinomial(probs[j], 1)]), j
        return torch.cat([drafts, original_multinomial(probs[-1], 1)]), drafts.shape[0]

    monkeypatch.setattr(generation_multi_token, "accept_speculative", biased_accept)
    outcomes, _ = multi_token_samples(model, NUM_SAMPLES, seed=2)
    statistic, dof, p_value = chi_square_p_value(outcomes, exact)
    print(f"biased variant: chi2={statistic:.1f} dof={dof} p={p_value:.2e}")
    assert p_value < 1e-6


def test_single_row_sampling_and_greedy_limit():
    """Batch size 1 samples too; at a temperature near 0 sampling is greedy, and so is the multi-token output."""
    model = peaked_model()
    torch.manual_seed(3)
    out = model.generate(PROMPT, max_new_tokens=12, multi_token_mode=True, do_sample=True, temperature=0.8)
    assert out.shape == (1, PROMPT.shape[1] + 12)
    cold = model.generate(PROMPT, max_new_tokens=12, multi_token_mode=True, do_sample=True, temperature=1e-4, top_k=0)
    assert torch.equal(cold, model.generate(PROMPT, max_new_tokens=12, do_sample=False))
