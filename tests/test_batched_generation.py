"""Batched verified decoding: rows of a left-padded batch accept different numbers of drafts, and each row is still
the output of plain greedy decoding, batched or alone."""

import pytest
import torch
from conftest import ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base
from test_generation import OracleDrafts, greedy, mtp, use_drafts

import transformers_mtp

PAD = 2


def left_padded(lengths, seed):
    """A left-padded batch of random prompts: (input_ids [B, L], attention_mask [B, L])."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        ids[i, width - length :] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[i, width - length :] = 1
    return ids, mask


def unpadded_greedy(model, ids, mask, **kwargs):
    """Each row decoded on its own, without padding, as a list of new-token lists."""
    rows = []
    for row, row_mask in zip(ids, mask):
        prompt = row[row_mask.bool()][None]
        rows.append(greedy(model, prompt, **kwargs)[0, prompt.shape[1] :].tolist())
    return rows


def new_tokens(sequences, prompt_width):
    """New tokens of each row, without the padding after its end."""
    return [[t for t in row[prompt_width:].tolist()] for row in sequences]


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_rows_match_greedy(arch, head_type, extra):
    model = randomize_heads(transformers_mtp.convert(tiny_base(arch, 1), num_heads=4, head_type=head_type, **extra),
                            1, 0.1)
    ids, mask = left_padded([3, 9, 1, 6], seed=2)
    expected = greedy(model, ids, attention_mask=mask, max_new_tokens=30)
    out = mtp(model, ids, attention_mask=mask, max_new_tokens=30, num_predict_heads=4)
    assert torch.equal(out.sequences, expected)
    assert new_tokens(out.sequences, ids.shape[1]) == unpadded_greedy(model, ids, mask, max_new_tokens=30)
    stats = out.multi_token_stats
    assert stats.new_tokens == 4 * 30 and sum(stats.head_proposed) > 0


@pytest.mark.parametrize("error_rate", [0.0, 0.3, 0.6])
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_accepting_different_numbers_of_drafts(arch, error_rate, monkeypatch):
    """Noisy oracle drafts: every row keeps its own number of drafts each step; EOS ends rows at different times."""
    model = randomize_heads(transformers_mtp.convert(tiny_base(arch, 3), num_heads=5, head_type="resblock"), 3)
    rows_padded_after_eos = 0
    for seed in range(3):
        ids, mask = left_padded([5, 2, 11, 7, 4, 8][: 2 + 2 * seed], seed=seed)
        # the penalty keeps tiny random models (GPT-2 especially) from repeating one token, so EOS can end rows early
        greedy_kwargs = dict(attention_mask=mask, max_new_tokens=40, repetition_penalty=3.0)
        reference = greedy(model, ids, **greedy_kwargs)
        # an EOS taken from one row's continuation ends that row (and maybe others) early
        new = reference[:, ids.shape[1]:]
        eos = next(int(t) for t in new[seed % ids.shape[0], 10 + seed:] if t not in new[:, :5])
        expected = greedy(model, ids, eos_token_id=eos, pad_token_id=PAD, **greedy_kwargs)
        use_drafts(monkeypatch, OracleDrafts(reference, error_rate, seed))
        out = mtp(model, ids, eos_token_id=eos, pad_token_id=PAD, num_predict_heads=5, **greedy_kwargs)
        monkeypatch.undo()
        assert torch.equal(out.sequences, expected), (seed, error_rate)
        rows_padded_after_eos += int((expected[:, -1] == PAD).sum())
        kept = out.multi_token_stats.accepted_per_step
        if error_rate == 0.0:
            assert max(kept) == 5
        else:
            assert len(set(kept)) > 2, "all rows kept the same number of drafts: the test checked little"
    assert rows_padded_after_eos > 0, "no row ended before the others: the test checked little"


def test_batched_with_logits_processor_and_stop_criteria():
    model = randomize_heads(transformers_mtp.convert(tiny_base("llama", 4), num_heads=4, head_type="resblock"), 4, 0.1)
    ids, mask = left_padded([4, 8, 6], seed=5)
    kwargs = dict(attention_mask=mask, max_new_tokens=25, repetition_penalty=1.4, min_new_tokens=5)
    assert torch.equal(mtp(model, ids, **kwargs).sequences, greedy(model, ids, **kwargs))


def test_batched_errors():
    model = randomize_heads(transformers_mtp.convert(tiny_base("llama", 0), num_heads=4, head_type="resblock"), 0)
    ids, mask = left_padded([3, 5], seed=0)
    with pytest.raises(ValueError, match="scores / logits for batch size 1 only"):
        mtp(model, ids, attention_mask=mask, max_new_tokens=5, output_scores=True)
    from transformers.generation.streamers import BaseStreamer

    class AnyStreamer(BaseStreamer):  # transformers' TextStreamer rejects the batched prompt itself
        def put(self, value):
            pass

        def end(self):
            pass

    with pytest.raises(ValueError, match="a streamer takes one sequence; got a batch of 2"):
        mtp(model, ids, attention_mask=mask, max_new_tokens=5, streamer=AnyStreamer())
    with pytest.raises(ValueError, match="prefix_allowed_tokens_fn is called with the batch index"):
        mtp(model, ids, attention_mask=mask, max_new_tokens=5, prefix_allowed_tokens_fn=lambda b, s: [3, 4])
