"""generate(multi_token_mode=True) is token-for-token generate(do_sample=False), whatever the heads draft."""

import random

import pytest
import torch
from conftest import ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base, tiny_mtp
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, StoppingCriteria

import transformers_mtp
from transformers_mtp.generation_proposers import Drafter, Drafts
from transformers_mtp.generation_state import DecodingState


def greedy(model, prompt, **kwargs):
    return model.generate(prompt, do_sample=False, **kwargs)


def mtp(model, prompt, **kwargs):
    kwargs = {"do_sample": False, "multi_token_mode": True, "return_dict_in_generate": True, **kwargs}
    return model.generate(prompt, **kwargs)


class OracleDrafts:
    """Drafts read from precomputed greedy continuations [B, L], each corrupted with probability `error_rate`."""

    def __init__(self, reference, error_rate, seed=0):
        self.reference, self.error_rate, self.rng = reference.tolist(), error_rate, random.Random(seed)

    def __call__(self, drafter, state, verified):
        all_drafts = []
        for i, reference in enumerate(self.reference):
            start = state.rows[i].shape[0]
            drafts = []
            for j in range(min(drafter.heads.max_drafts, state.room(i))):
                right = reference[start + j] if start + j < len(reference) else 3
                wrong = (right + 1 + self.rng.randrange(VOCAB - 1)) % VOCAB
                drafts.append(wrong if self.rng.random() < self.error_rate else right)
            all_drafts.append(torch.tensor(drafts, dtype=torch.long))
        return Drafts(all_drafts, None)


def use_drafts(monkeypatch, drafter):
    """Replace the heads' drafting step of the decode loop with `drafter`."""
    monkeypatch.setattr(Drafter, "propose", lambda self, state, verified: drafter(self, state, verified))


# --- property test ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_random_heads_match_greedy(arch, head_type, extra, k):
    proposed = 0
    for seed in range(2):
        model = randomize_heads(
            transformers_mtp.convert(tiny_base(arch, seed), num_heads=6, head_type=head_type, **extra), seed, 0.1
        )
        rng = random.Random(seed * 100 + k)
        for prompt_len in (1, 4, 13):
            prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(seed + prompt_len))
            max_new = rng.randint(1, 40)
            expected = greedy(model, prompt, max_new_tokens=max_new)
            out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k)
            assert torch.equal(out.sequences, expected), (seed, prompt_len, max_new)
            proposed += sum(out.multi_token_stats.head_proposed)
            # EOS placed on a token of the greedy continuation: both stop at its first occurrence
            new = expected[0, prompt_len:]
            eos = int(new[rng.randrange(len(new))])
            expected = greedy(model, prompt, max_new_tokens=max_new, eos_token_id=eos)
            out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k, eos_token_id=eos)
            assert torch.equal(out.sequences, expected), (seed, prompt_len, max_new, eos)
            assert out.sequences[0, -1] == eos or out.sequences.shape[1] == prompt_len + max_new
    assert proposed > 0


@pytest.mark.parametrize("error_rate", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("k", [2, 4, 6])
@pytest.mark.parametrize("arch", ARCHS)
def test_noisy_oracle_drafts_match_greedy(arch, k, error_rate, monkeypatch):
    """Partial acceptance at every depth, EOS and max_new_tokens landing inside accepted blocks."""
    model = tiny_mtp(arch, "resblock", num_heads=6)
    for seed in range(4):
        prompt = torch.randint(3, VOCAB, (1, 1 + 3 * seed), generator=torch.Generator().manual_seed(seed))
        reference = greedy(model, prompt, max_new_tokens=60)
        use_drafts(monkeypatch, OracleDrafts(reference, error_rate, seed))
        for max_new in (1, 7, 30, 60):
            out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k)
            assert torch.equal(out.sequences, reference[:, : prompt.shape[1] + max_new])
            eos = int(reference[0, min(prompt.shape[1] + max_new // 2, reference.shape[1] - 1)])
            expected = greedy(model, prompt, max_new_tokens=max_new, eos_token_id=eos)
            assert torch.equal(mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k,
                                   eos_token_id=eos).sequences, expected)
        monkeypatch.undo()


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("arch", ARCHS)
def test_full_acceptance_emits_k_tokens_per_forward(arch, k, monkeypatch):
    model = tiny_mtp(arch, num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(k))
    max_new = 1 + 6 * k  # prefill emits 1 token, then 6 steps of k tokens
    reference = greedy(model, prompt, max_new_tokens=max_new)
    use_drafts(monkeypatch, OracleDrafts(reference, 0.0))
    out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k)
    stats = out.multi_token_stats
    assert torch.equal(out.sequences, reference)
    assert stats.forward_passes == 7 and stats.new_tokens == max_new
    assert stats.head_acceptance == [1.0] * (k - 1)
    assert stats.tokens_per_forward == max_new / 7
    assert stats.to_dict()["head_proposed"] == [6] * (k - 1)
    assert stats.accepted_per_step == [k] * 6


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_after_rollback_equals_rebuilt_cache(arch, monkeypatch):
    model = tiny_mtp(arch, num_heads=5)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    reference = greedy(model, prompt, max_new_tokens=40)
    use_drafts(monkeypatch, OracleDrafts(reference, 0.3, seed=1))
    checked = []
    original = DecodingState.roll_back

    def checking_roll_back(decoder, keep):
        removed = decoder.cache.get_seq_length() - keep
        original(decoder, keep)
        # everything but the newest emitted token (it is fed in the next pass) is cached, nothing more
        sequence = decoder.rows[0][None]
        assert decoder.cache.get_seq_length() == sequence.shape[1] - 1
        rebuilt = model(sequence[:, :-1], use_cache=True).cache
        for got, want in zip(decoder.cache.layers, rebuilt.layers):
            assert got.keys.shape == want.keys.shape
            # Same values up to float reordering: the cached rows came from a k-token pass, the rebuilt ones from
            # one pass over the whole sequence (different GEMM shapes sum in a different order).
            assert torch.allclose(got.keys, want.keys, atol=1e-5) and torch.allclose(got.values, want.values, atol=1e-5)
        checked.append(removed)

    monkeypatch.setattr(DecodingState, "roll_back", checking_roll_back)
    out = mtp(model, prompt, max_new_tokens=40, num_predict_heads=5)
    assert torch.equal(out.sequences, reference)
    assert any(r > 0 for r in checked), "no partial acceptance happened: the test checked nothing"


# --- parity with generate() features -----------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_processors_attention_mask_and_scores(arch, monkeypatch):
    model = tiny_mtp(arch, num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=25, repetition_penalty=1.3, min_new_tokens=10, attention_mask=torch.ones_like(prompt))
    expected = model.generate(prompt, do_sample=False, return_dict_in_generate=True, output_scores=True,
                              output_logits=True, **kwargs)
    use_drafts(monkeypatch, OracleDrafts(expected.sequences, 0.3))
    out = mtp(model, prompt, output_scores=True, output_logits=True, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == expected.sequences.shape[1] - 7 >= 10  # min_new_tokens
    for got, want in zip(out.scores, expected.scores):
        assert torch.allclose(got, want, atol=1e-5)
    for got, want in zip(out.logits, expected.logits):
        assert torch.allclose(got, want, atol=1e-5)
    # a user-supplied logits processor list is honoured too
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(2.0)])
    assert torch.equal(mtp(model, prompt, max_new_tokens=20, logits_processor=processors).sequences,
                       greedy(model, prompt, max_new_tokens=20, logits_processor=processors))


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_single_row(arch):
    model = tiny_mtp(arch, num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    prompt[0, :3] = 2  # pad
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    expected = greedy(model, prompt, attention_mask=mask, max_new_tokens=30)
    assert torch.equal(mtp(model, prompt, attention_mask=mask, max_new_tokens=30).sequences, expected)


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria_and_max_length(monkeypatch):
    model = tiny_mtp("llama", num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(7))
    reference = greedy(model, prompt, max_new_tokens=40)
    use_drafts(monkeypatch, OracleDrafts(reference, 0.0))
    stop = int(reference[0, 4 + 13])
    expected = greedy(model, prompt, max_new_tokens=40, stopping_criteria=[StopAfterToken(stop)])
    got = mtp(model, prompt, max_new_tokens=40, stopping_criteria=[StopAfterToken(stop)]).sequences
    assert torch.equal(got, expected) and got.shape[1] < reference.shape[1]
    assert torch.equal(mtp(model, prompt, max_length=15).sequences, greedy(model, prompt, max_length=15))


def test_generation_config_sets_default_num_predict_heads():
    model = tiny_mtp("gpt2", num_heads=5)
    prompt = torch.randint(3, VOCAB, (1, 4))
    assert mtp(model, prompt, max_new_tokens=8).multi_token_stats.num_predict_heads == 5
    model.generation_config.num_predict_heads = 2
    assert mtp(model, prompt, max_new_tokens=8).multi_token_stats.num_predict_heads == 2
    assert mtp(model, prompt, max_new_tokens=8, num_predict_heads=3).multi_token_stats.num_predict_heads == 3


def test_plain_sequences_without_return_dict():
    model = tiny_mtp("llama")
    prompt = torch.randint(3, VOCAB, (1, 4))
    out = model.generate(prompt, max_new_tokens=12, do_sample=False, multi_token_mode=True)
    assert isinstance(out, torch.Tensor) and torch.equal(out, greedy(model, prompt, max_new_tokens=12))


# --- unverified mode ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_unverified_mode_appends_every_draft(arch, monkeypatch):
    model = tiny_mtp(arch, num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 5))
    out = mtp(model, prompt, max_new_tokens=33, multi_token_mode="unverified")
    stats = out.multi_token_stats
    assert out.sequences.shape[1] == 5 + 33 and not stats.verified
    assert stats.forward_passes == 1 + 8  # 1 token from the prefill, then 4 per pass
    assert stats.tokens_per_forward == 33 / 9
    # with drafts that are always right it is greedy
    reference = greedy(model, prompt, max_new_tokens=33)
    use_drafts(monkeypatch, OracleDrafts(reference, 0.0))
    assert torch.equal(model.generate(prompt, max_new_tokens=33, multi_token_mode="unverified"), reference)


# --- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,kwargs,message",
    [
        ("too many heads", {"num_predict_heads": 5}, "num_predict_heads=5 exceeds the model's num_heads=4; pass at most 4"),
        ("zero heads", {"num_predict_heads": 0}, "num_predict_heads=0 must be an integer from 1 to num_heads=4"),
        ("unverified sampling", {"multi_token_mode": "unverified", "do_sample": True}, "decodes one greedy sequence"),
        ("beams", {"num_beams": 2}, "does not support beam search \\(num_beams=2\\)"),
        ("return sequences", {"num_return_sequences": 2}, "do not support `num_return_sequences`"),  # transformers' own
        ("bad mode", {"multi_token_mode": "fast"}, "multi_token_mode='fast' is not supported"),
        ("attentions", {"output_attentions": True, "return_dict_in_generate": True}, "cannot return attentions"),
        ("stop strings", {"stop_strings": ["a"]}, "needs the tokenizer"),
        ("unverified scores", {"multi_token_mode": "unverified", "return_dict_in_generate": True,
                               "output_scores": True}, "has no base-model scores"),
    ],
)
def test_unsupported_combinations_raise(name, kwargs, message):
    model = tiny_mtp("llama", num_heads=4)
    kwargs = {"multi_token_mode": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.generate(torch.randint(3, VOCAB, (1, 4)), max_new_tokens=5, **kwargs)


def test_batch_and_length_errors():
    model = tiny_mtp("gpt2", num_heads=4)
    with pytest.raises(ValueError, match="decodes one greedy sequence at a time.*batch size 2"):
        model.generate(torch.randint(3, VOCAB, (2, 4)), max_new_tokens=5, multi_token_mode="unverified")
    with pytest.raises(ValueError, match="exceeds the model's n_positions=256"):
        model.generate(torch.randint(3, VOCAB, (1, 250)), max_new_tokens=10, multi_token_mode=True)
    with pytest.raises(ValueError, match="only applies with multi_token_mode=True"):
        model.generate(torch.randint(3, VOCAB, (1, 4)), max_new_tokens=5, num_predict_heads=2)


# --- wrapped by PEFT -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_through_peft_wrapper(arch):
    from peft import LoraConfig, get_peft_model

    model = tiny_mtp(arch, "query_extension", num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 6))
    expected = greedy(model, prompt, max_new_tokens=20)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=r".*mtp_heads\.\d+\.q_proj"))
    assert all("mtp_heads" in n for n, p in peft_model.named_parameters() if p.requires_grad)
    out = peft_model.generate(input_ids=prompt, max_new_tokens=20, do_sample=False, multi_token_mode=True,
                              return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected) and out.multi_token_stats.forward_passes > 0


# --- adaptive draft length --------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
def test_confidence_threshold_drafts_less_and_stays_greedy(head_type, extra):
    model = randomize_heads(transformers_mtp.convert(tiny_base("llama", 2), num_heads=4, head_type=head_type, **extra),
                            2, 0.1)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    expected = greedy(model, prompt, max_new_tokens=40)
    full = mtp(model, prompt, max_new_tokens=40)
    # thresholds between the heads' own top probabilities (near 1/VOCAB for random heads), so some drafts pass
    confidence = model(expected, output_head_logits=True).head_logits.softmax(-1).amax(-1).flatten()
    proposed = []
    for threshold in (*confidence.quantile(torch.tensor([0.25, 0.5, 0.75])).tolist(), 0.99):
        out = mtp(model, prompt, max_new_tokens=40, draft_confidence_threshold=threshold)
        assert torch.equal(out.sequences, expected), threshold
        proposed.append(sum(out.multi_token_stats.head_proposed))
    assert sum(full.multi_token_stats.head_proposed) >= proposed[0] >= proposed[-1]
    assert proposed[-1] < proposed[0], "the threshold never cut a draft: the test checked nothing"
    # from the generation config, as num_predict_heads
    model.generation_config.draft_confidence_threshold = 0.99
    assert sum(mtp(model, prompt, max_new_tokens=40).multi_token_stats.head_proposed) == proposed[-1]


@pytest.mark.parametrize("threshold", [1.0, -0.1, "high", True])
def test_bad_confidence_threshold(threshold):
    model = tiny_mtp("llama")
    with pytest.raises(ValueError, match=f"draft_confidence_threshold={threshold!r} must be a probability in \\[0, 1\\)"):
        mtp(model, torch.randint(3, VOCAB, (1, 4)), max_new_tokens=5, draft_confidence_threshold=threshold)


# --- context lookup drafts ----------------------------------------------------------------------------------------
def test_context_continuation_takes_the_latest_longest_match():
    from transformers_mtp.generation_draft_sources import context_continuation

    tokens = torch.tensor([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2])
    assert context_continuation(tokens, 3, 3).tolist() == [3, 7, 1]  # [1, 2] last seen before "3, 7, 1"
    assert context_continuation(tokens, 2, 1).tolist() == [3, 7]  # unigram "2" last seen before "3, 7"
    loop = torch.tensor([4, 9, 9, 9, 9])  # the latest "9, 9" has one token after it; the earliest has two
    assert context_continuation(loop, 2, 2).tolist() == [9, 9] and context_continuation(loop, 1, 2).tolist() == [9]
    assert context_continuation(torch.tensor([1, 2, 3]), 2, 3).tolist() == []  # nothing repeats
    assert context_continuation(torch.tensor([4]), 2, 3).tolist() == []


@pytest.mark.parametrize("ngram", [1, 2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_context_lookup_drafts_stay_greedy(arch, ngram):
    model = tiny_mtp(arch, "query_extension", num_heads=4, head_input="feature_and_token")
    # a prompt that repeats itself, so lookups hit
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(ngram)).repeat(1, 3)
    for threshold in (0.0, 0.5):
        expected = greedy(model, prompt, max_new_tokens=40)
        out = mtp(model, prompt, max_new_tokens=40, draft_lookup_ngram=ngram, draft_confidence_threshold=threshold)
        assert torch.equal(out.sequences, expected)
        assert sum(out.multi_token_stats.head_proposed) > 0
    # a step may copy more tokens from the context than the heads draft
    expected = greedy(model, prompt, max_new_tokens=40)
    out = mtp(model, prompt, max_new_tokens=40, num_predict_heads=2, draft_lookup_ngram=ngram, draft_lookup_num_tokens=6)
    assert torch.equal(out.sequences, expected)
    stats = out.multi_token_stats
    assert len(stats.head_proposed) == 6 and sum(stats.head_proposed[1:]) > 0 and max(stats.accepted_per_step) > 2
    with pytest.raises(ValueError, match="draft_lookup_ngram=-1 must be an integer from 0 to 8"):
        mtp(model, prompt, max_new_tokens=5, draft_lookup_ngram=-1)
    with pytest.raises(ValueError, match="draft_lookup_num_tokens=40 must be an integer from 0 to 32"):
        mtp(model, prompt, max_new_tokens=5, draft_lookup_num_tokens=40)


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
def test_every_head_drafts_each_step(head_type, extra):
    """With k heads and no lookup or threshold, every step sends k - 1 drafts (fewer only at the token budget)."""
    model = tiny_mtp("llama", head_type, num_heads=4, **extra)
    out = model.generate(torch.randint(3, VOCAB, (1, 7)), max_new_tokens=16, do_sample=False, eos_token_id=None,
                         multi_token_mode=True, draft_lookup_ngram=0, return_dict_in_generate=True)
    proposed = out.multi_token_stats.head_proposed
    assert len(proposed) == 3 and proposed[0] >= proposed[2] > 0 and proposed[0] - proposed[2] <= 2, proposed


# --- draft datastore ----------------------------------------------------------------------------------------------
def test_build_draft_datastore_keeps_the_most_frequent_continuations():
    from transformers_mtp.draft_datastore import build_draft_datastore
    from transformers_mtp.generation_draft_sources import (
        datastore_continuation,
        datastore_key,
    )

    answers = [{"input_ids": [9, 5, 6, 7, 8, 9, 10], "prompt_length": 2},   # (5, 6, 7) -> (8, 9) twice ...
               {"input_ids": [5, 6, 7, 8, 9, 11], "prompt_length": 3},
               {"input_ids": [5, 6, 7, 4, 4, 12], "prompt_length": 3}]     # ... and (4, 4) once
    keys, tokens = build_draft_datastore(answers, vocab_size=20, length=2, max_entries=10, min_count=2)
    assert keys.tolist() == [datastore_key(torch.tensor([5, 6, 7]), 20).item()] and tokens.tolist() == [[8, 9]]
    assert datastore_continuation(torch.tensor([3, 5, 6, 7]), 2, (keys, tokens), 20).tolist() == [8, 9]
    assert datastore_continuation(torch.tensor([3, 5, 6, 7]), 1, (keys, tokens), 20).tolist() == [8]
    assert datastore_continuation(torch.tensor([3, 5, 6, 8]), 2, (keys, tokens), 20).tolist() == []
    assert datastore_continuation(torch.tensor([6, 7]), 2, (keys, tokens), 20).tolist() == []  # shorter than 3
    keys, tokens = build_draft_datastore(answers, vocab_size=20, length=2, max_entries=2, min_count=1)
    assert keys.shape == (2,) and bool((keys[1:] > keys[:-1]).all())  # the 2 most frequent, sorted for search
    assert build_draft_datastore(answers[::-1], vocab_size=20, length=2, max_entries=2, min_count=1)[0].equal(keys)


@pytest.mark.parametrize("head_type,extra", [("resblock", {}), ("query_extension", {"head_input": "sequential"})])
@pytest.mark.parametrize("arch", ARCHS)
def test_datastore_drafts_stay_greedy_and_survive_save_and_load(arch, head_type, extra, tmp_path):
    from transformers import AutoModelForCausalLM

    from transformers_mtp.draft_datastore import build_draft_datastore

    model = randomize_heads(transformers_mtp.convert(tiny_base(arch), num_heads=4, head_type=head_type,
                                                     draft_datastore_size=400, **extra), 0, 0.5).eval()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (1, n), generator=generator) for n in (3, 5, 8, 12)]
    # a datastore from the model's own greedy answers to half the prompts, plus a corrupted copy of some entries:
    # its drafts are often right and sometimes wrong
    answers = [{"input_ids": greedy(model, p, max_new_tokens=30)[0].tolist(), "prompt_length": p.shape[1]}
               for p in prompts[:2]]
    keys, tokens = build_draft_datastore(answers, vocab_size=VOCAB, length=3, max_entries=400, min_count=1)
    tokens[::3] = (tokens[::3] + 1) % VOCAB
    model.set_draft_datastore(keys, tokens)
    hits = 0
    for prompt in prompts:
        for k in (2, 4):
            expected = greedy(model, prompt, max_new_tokens=30)
            out = mtp(model, prompt, max_new_tokens=30, num_predict_heads=k, draft_lookup_ngram=0)
            assert torch.equal(out.sequences, expected)
            off = mtp(model, prompt, max_new_tokens=30, num_predict_heads=k, draft_lookup_ngram=0, draft_datastore=False)
            assert torch.equal(off.sequences, expected)
            hits += out.multi_token_stats.forward_passes < off.multi_token_stats.forward_passes
    assert hits > 0  # the datastore saved forward passes somewhere
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert loaded.config.draft_datastore_size == 400
    assert all(torch.equal(a, b) for a, b in zip(loaded.draft_datastore(), model.draft_datastore()))


def test_datastore_errors_are_clear():
    model = tiny_mtp("llama")
    with pytest.raises(ValueError, match="draft_datastore=True, but this model has no draft datastore"):
        mtp(model, torch.randint(3, VOCAB, (1, 4)), max_new_tokens=5, draft_datastore=True)
    with pytest.raises(ValueError, match="draft_datastore_size=0 must be a positive number of entries"):
        transformers_mtp.convert(tiny_base("llama"), num_heads=3, draft_datastore_size=0)
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, draft_datastore_size=2)
    with pytest.raises(ValueError, match="does not fit this model: it holds at most draft_datastore_size=2"):
        model.set_draft_datastore(torch.arange(3), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="must be sorted and unique"):
        model.set_draft_datastore(torch.tensor([5, 2]), torch.zeros(2, 2, dtype=torch.long))


# --- regressions: per-row processor state, cache cropping across releases, positions of direct callers -------------
def test_processor_token_lists_as_long_as_the_batch_are_not_cut_per_row():
    """suppress_tokens / an EOS list whose length equals the batch size hold token ids, not one entry per row."""
    model = tiny_mtp("llama", "linear", randomize=False)
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    plain = greedy(model, prompt, attention_mask=mask, max_new_tokens=8)
    # each row's first greedy token, banned for both rows; cut per row, row 0 would keep only row 1's
    banned = [int(plain[1, 5]), int(plain[0, 5])]
    assert banned[0] != banned[1]
    kwargs = dict(attention_mask=mask, max_new_tokens=8, suppress_tokens=banned)
    reference = greedy(model, prompt, **kwargs)
    out = mtp(model, prompt, **kwargs).sequences
    assert torch.equal(out, reference)
    assert not any(token in out[:, 5:].tolist()[row] for row in range(2) for token in banned)
    prompt3 = torch.cat([prompt, prompt[:1].flip(1)])
    mask3 = torch.cat([mask, torch.ones_like(mask[:1])])
    kwargs = dict(attention_mask=mask3, max_new_tokens=8, min_new_tokens=6, eos_token_id=[1, int(plain[0, 5]), 7],
                  pad_token_id=2)
    assert torch.equal(mtp(model, prompt3, **kwargs).sequences, greedy(model, prompt3, **kwargs))


def test_decoding_never_relies_on_crop_zero(monkeypatch):
    """Before transformers 5, `crop(0)` emptied a cache (and a positive argument was the length to keep); a
    trust_remote_code user may run such a release, so the loop only ever asks for a removal of n > 0 tokens."""
    from transformers.cache_utils import DynamicCache

    original = DynamicCache.crop

    def old_crop(self, max_length):
        if max_length >= 0:  # the old meaning: keep the first max_length positions (0 empties the cache)
            max_length = max_length - self.get_seq_length()
            if max_length == 0:
                for layer in self.layers:
                    layer.keys, layer.values = layer.keys[..., :0, :], layer.values[..., :0, :]
                return
        original(self, max_length)

    monkeypatch.setattr(DynamicCache, "crop", old_crop)
    for arch in ARCHS:
        model = tiny_mtp(arch, "linear", randomize=False)
        prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
        out = mtp(model, prompt, max_new_tokens=16)
        assert torch.equal(out.sequences, greedy(model, prompt, max_new_tokens=16))
        assert out.multi_token_stats.tokens_per_forward > 1.5  # drafts were accepted, so the cache was cropped


def test_direct_callers_get_positions_from_the_mask():
    """Without position_ids (a caller of the decode loop that is not generate()), left padding gives each row
    positions counted from its first real token, as generate() computes them; GPT-2's absolute positions need it."""
    from transformers.cache_utils import DynamicCache

    model = tiny_mtp("gpt2")
    prompt = torch.randint(3, VOCAB, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    decoder = DecodingState(model, prompt, logits_processor=LogitsProcessorList(), stopping_criteria=[], streamer=None,
                            attention_mask=mask, position_ids=None, cache=DynamicCache(), keep_scores=False,
                            do_sample=False, pad_token_id=2)
    assert decoder.prompt_positions.tolist() == [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert decoder.last_position.tolist() == [3, 5]


@pytest.mark.parametrize("mode", ["chain", "tree", "unverified", "batch"])
@pytest.mark.parametrize("arch", ARCHS)
def test_returned_cache_is_the_text_but_its_last_token(arch, mode):
    """Whatever the loop left in the cache (rejected drafts, other branches of a tree, rows that accepted fewer), the
    cache returned holds exactly each row's tokens but the last, as plain generate() leaves it."""
    model = tiny_mtp(arch, "linear", randomize=mode != "unverified")
    batch = 3 if mode == "batch" else 1
    prompt = torch.randint(3, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(prompt)
    if batch > 1:
        mask[0, :3] = 0
        mask[2, :1] = 0
    kwargs = {"draft_tree_size": 6} if mode == "tree" else {}
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=13, do_sample=False, eos_token_id=None,
                         pad_token_id=2, return_dict_in_generate=True,
                         multi_token_mode="unverified" if mode == "unverified" else True, **kwargs)
    assert out.multi_token_stats.tokens_per_forward > 1.0  # drafts were accepted (or appended)
    text = out.sequences[:, :-1]
    full_mask = torch.cat([mask, torch.ones_like(text[:, 6:])], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() counts them under left padding
    rebuilt = model(text, attention_mask=full_mask, position_ids=positions, use_cache=True).cache
    assert out.cache.get_seq_length() == text.shape[1]
    real = full_mask.bool()  # padding positions hold anything
    for ours, theirs in zip(out.cache.layers, rebuilt.layers):
        torch.testing.assert_close(ours.keys.transpose(1, 2)[real], theirs.keys.transpose(1, 2)[real], rtol=1e-4,
                                   atol=1e-5)
        torch.testing.assert_close(ours.values.transpose(1, 2)[real], theirs.values.transpose(1, 2)[real],
                                   rtol=1e-4, atol=1e-5)


def test_multi_token_options_are_resolved_once_from_call_then_generation_config():
    from transformers import GenerationConfig

    from transformers_mtp.generation_options import MultiTokenOptions

    model = tiny_mtp("llama", num_heads=4)
    model.generation_config.num_predict_heads = 3
    options = MultiTokenOptions.resolve(model, True)
    assert (options.num_predict_heads, options.verify, options.draft_lookup_num_tokens) == (3, True, 2)
    assert options.draft_tree_from_config
    options = MultiTokenOptions.resolve(model, "unverified", GenerationConfig(num_predict_heads=2), draft_tree_size=0)
    assert (options.num_predict_heads, options.verify, options.draft_tree_from_config) == (2, False, False)
    with pytest.raises(ValueError, match=r"Unknown multi-token options \['num_predict_head'\]"):
        MultiTokenOptions.resolve(model, True, num_predict_head=2)
    with pytest.raises(ValueError, match="multi_token_mode='fast' is not supported"):
        MultiTokenOptions.resolve(model, "fast")
    with pytest.raises(ValueError, match="draft_tree_size=4 only applies with multi_token_mode=True"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, draft_tree_size=4)
