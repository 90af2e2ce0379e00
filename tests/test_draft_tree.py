"""Draft trees (`draft_tree_size`): every branch verified in one pass, the output still exactly greedy."""

import random

import pytest
import torch
from conftest import ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base, tiny_mtp
from test_generation import greedy, mtp
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import transformers_mtp
from transformers_mtp.generation_draft_tree import DraftTree, grow_draft_tree
from transformers_mtp.generation_proposers import Drafter
from transformers_mtp.generation_state import DecodingState

# head designs that draft trees: heads that draft independently and share the base model's keys and values, and
# the chained drafter (its own dynamic tree, depth by depth)
TREE_SETUPS = [(setup, name) for setup, name in zip(HEAD_SETUPS, HEAD_IDS)
               if name in ("linear", "resblock", "qext", "qext-token", "chained")]


# --- building a tree ----------------------------------------------------------------------------------------------
def test_grow_draft_tree_takes_the_most_probable_paths_first():
    # head 1 offers tokens 10 (0.6) and 11 (0.3); head 2 offers 20 (0.5) and 21 (0.4)
    tokens, probs = [[10, 11], [20, 21]], [[0.6, 0.3], [0.5, 0.4]]
    tree = grow_draft_tree(DraftTree.rooted_at(5), tokens, probs, size=4)
    # path scores: 10 0.6, 10-20 0.30, 11 0.3, 10-21 0.24, 11-20 0.15: ties go to the shallower path
    assert tree.tokens == [5, 10, 11, 20, 21] and tree.parents == [-1, 0, 0, 1, 1] and tree.depths == [0, 1, 1, 2, 2]
    assert grow_draft_tree(DraftTree.rooted_at(5), tokens, probs, size=2).tokens == [5, 10, 11]
    # a threshold drops candidates below it, wherever they are
    assert grow_draft_tree(DraftTree.rooted_at(5), tokens, probs, size=8, threshold=0.45).tokens == [5, 10, 20]
    # a path already in the tree (the context's) costs nothing and is grown from
    tree = DraftTree.rooted_at(5)
    tree.add(tree.add(0, 10), 33)
    grow_draft_tree(tree, tokens, probs, size=4)
    assert tree.tokens == [5, 10, 33, 11, 20] and tree.parents == [-1, 0, 1, 0, 1]


def test_tree_attention_mask_shows_each_node_its_ancestors_only():
    tree = DraftTree.rooted_at(5)
    a = tree.add(0, 7)
    tree.add(a, 8)
    tree.add(0, 9)
    mask = tree.attention_mask(torch.tensor([[1, 0, 1]]), torch.float32)
    assert mask.shape == (1, 1, 4, 7)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [[1, 0, 1, 1, 0, 0, 0],
                       [1, 0, 1, 1, 1, 0, 0],
                       [1, 0, 1, 1, 1, 1, 0],
                       [1, 0, 1, 1, 0, 0, 1]]


# --- decoding -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree_size", [1, 5, 16])
@pytest.mark.parametrize("setup", [s for s, _ in TREE_SETUPS], ids=[n for _, n in TREE_SETUPS])
@pytest.mark.parametrize("arch", ARCHS)
def test_draft_trees_match_greedy(arch, setup, tree_size):
    head_type, extra = setup
    proposed = 0
    for seed in range(2):
        model = randomize_heads(
            transformers_mtp.convert(tiny_base(arch, seed), num_heads=5, head_type=head_type, **extra), seed, 0.1
        )
        rng = random.Random(seed * 100 + tree_size)
        for prompt_len, k, lookup in ((1, 5, 0), (4, 3, 3), (13, 4, 2)):
            prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(seed + prompt_len))
            max_new = rng.randint(1, 40)
            expected = greedy(model, prompt, max_new_tokens=max_new)
            out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k, draft_lookup_ngram=lookup,
                      draft_tree_size=tree_size)
            assert torch.equal(out.sequences, expected), (seed, prompt_len, max_new)
            stats = out.multi_token_stats
            assert stats.new_tokens == expected.shape[1] - prompt_len
            assert stats.forward_passes == 1 + len(stats.accepted_per_step)
            proposed += sum(stats.head_proposed)
            new = expected[0, prompt_len:]
            eos = int(new[rng.randrange(len(new))])
            expected = greedy(model, prompt, max_new_tokens=max_new, eos_token_id=eos)
            out = mtp(model, prompt, max_new_tokens=max_new, num_predict_heads=k, draft_lookup_ngram=lookup,
                      draft_tree_size=tree_size, eos_token_id=eos)
            assert torch.equal(out.sequences, expected), (seed, prompt_len, max_new, eos)
    assert proposed > 0


class OracleTrees:
    """Draft trees whose right continuation (from a precomputed greedy output) sits in a random branch among wrong
    siblings, and is sometimes missing: the accepted path is often not the first nodes, so the cache is reordered."""

    def __init__(self, reference, seed=0, depth=3, siblings=2, error_rate=0.2):
        self.reference, self.rng = reference[0].tolist(), random.Random(seed)
        self.depth, self.siblings, self.error_rate = depth, siblings, error_rate

    def __call__(self, state, verified):
        start = state.rows[0].shape[0]
        tree, parent = DraftTree.rooted_at(int(state.rows[0][-1])), 0
        for j in range(min(self.depth, state.room(0))):
            right = self.reference[start + j] if start + j < len(self.reference) else 3
            wrong = [(right + 1 + self.rng.randrange(VOCAB - 1)) % VOCAB for _ in range(self.siblings)]
            candidates = wrong + ([] if self.rng.random() < self.error_rate else [right])
            self.rng.shuffle(candidates)
            nodes = {token: tree.add(parent, token) for token in candidates}
            if right not in nodes:
                break
            parent = nodes[right]
        return tree


@pytest.mark.parametrize("arch", ARCHS)
def test_oracle_trees_keep_the_accepted_branch_in_the_cache(arch, monkeypatch):
    model = tiny_mtp(arch, num_heads=5)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    reference = greedy(model, prompt, max_new_tokens=40)
    drafter = OracleTrees(reference, seed=2)
    monkeypatch.setattr(Drafter, "propose", lambda self, state, verified: drafter(state, verified))
    reordered = []
    original = DecodingState.keep_path

    def checking_keep_path(decoder, start, path):
        original(decoder, start, path)
        # everything but the newest emitted token (it is fed in the next pass) is cached, nothing more
        sequence = decoder.rows[0][None]
        assert decoder.cache.get_seq_length() == sequence.shape[1] - 1 == decoder.attention_mask.shape[1]
        rebuilt = model(sequence[:, :-1], use_cache=True).cache
        for got, want in zip(decoder.cache.layers, rebuilt.layers):
            assert got.keys.shape == want.keys.shape
            assert torch.allclose(got.keys, want.keys, atol=1e-5) and torch.allclose(got.values, want.values, atol=1e-5)
        reordered.append(path != list(range(len(path))))

    monkeypatch.setattr(DecodingState, "keep_path", checking_keep_path)
    out = mtp(model, prompt, max_new_tokens=40, draft_tree_size=9)
    assert torch.equal(out.sequences, reference)
    assert any(reordered), "no branch but the first was accepted: the test checked no reordering"
    assert out.multi_token_stats.tokens_per_forward > 1.5


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_trees_with_processors_scores_and_a_datastore_match_greedy(arch):
    from transformers_mtp.draft_datastore import build_draft_datastore

    model = randomize_heads(transformers_mtp.convert(tiny_base(arch), num_heads=4, head_type="resblock",
                                                     draft_datastore_size=400), 0, 0.5).eval()
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (1, n), generator=generator) for n in (3, 8)]
    answers = [{"input_ids": greedy(model, p, max_new_tokens=30)[0].tolist(), "prompt_length": p.shape[1]}
               for p in prompts]
    model.set_draft_datastore(*build_draft_datastore(answers, vocab_size=VOCAB, length=3, max_entries=400,
                                                     min_count=1))
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])
    for prompt in prompts:
        expected = model.generate(prompt, do_sample=False, max_new_tokens=30, logits_processor=processors,
                                  return_dict_in_generate=True, output_scores=True, output_logits=True)
        out = mtp(model, prompt, max_new_tokens=30, logits_processor=processors, draft_tree_size=6,
                  output_scores=True, output_logits=True)
        assert torch.equal(out.sequences, expected.sequences)
        assert len(out.scores) == len(expected.scores) == len(out.logits)
        for got, want in zip(out.scores, expected.scores):
            assert torch.allclose(got, want, atol=1e-4)
        plain = mtp(model, prompt, max_new_tokens=30, draft_tree_size=6)
        assert torch.equal(plain.sequences, greedy(model, prompt, max_new_tokens=30))
        # the datastore knows these answers: the tree drafts them
        assert plain.multi_token_stats.tokens_per_forward > 1.5


def test_draft_tree_errors_are_clear(monkeypatch):
    model = tiny_mtp("llama", num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 4))
    for bad in (-1, 65, 2.5, True):
        with pytest.raises(ValueError, match=rf"draft_tree_size={bad!r} must be an integer from 0 to 64"):
            mtp(model, prompt, max_new_tokens=5, draft_tree_size=bad)
    with pytest.raises(ValueError, match="draft_tree_size=8 only applies with multi_token_mode=True"):
        model.generate(prompt, max_new_tokens=5, draft_tree_size=8)
    needs_one_greedy_row = "draft_tree_size=8 drafts a tree of candidates, which needs verified greedy decoding"
    with pytest.raises(ValueError, match=needs_one_greedy_row + r".*do_sample=True"):
        mtp(model, prompt, max_new_tokens=5, do_sample=True, draft_tree_size=8)
    with pytest.raises(ValueError, match=needs_one_greedy_row + r".*batch size 2"):
        mtp(model, prompt.repeat(2, 1), max_new_tokens=5, draft_tree_size=8, pad_token_id=2)
    with pytest.raises(ValueError, match=needs_one_greedy_row + r".*'unverified'"):
        mtp(model, prompt, max_new_tokens=5, multi_token_mode="unverified", draft_tree_size=8)
    chained = tiny_mtp("llama", "query_extension", head_input="sequential")
    with pytest.raises(ValueError, match="heads that draft independently.*pass draft_tree_size=0"):
        mtp(chained, prompt, max_new_tokens=5, draft_tree_size=8)
    own_kv = tiny_mtp("gpt2", "query_extension", head_share_kv=False)
    with pytest.raises(ValueError, match="share the base model's keys and values"):
        mtp(own_kv, prompt, max_new_tokens=5, draft_tree_size=8)
    # the generation config's value is used, and checked the same way; where trees cannot be drafted (sampling,
    # batches), a configured default drafts chains instead of raising
    model.generation_config.draft_tree_size = 4
    trees = []
    forward_tree = DecodingState.forward_tree
    monkeypatch.setattr(DecodingState, "forward_tree", lambda decoder, tree: trees.append(tree) or forward_tree(decoder, tree))
    assert torch.equal(mtp(model, prompt, max_new_tokens=12).sequences, greedy(model, prompt, max_new_tokens=12))
    # 4 head candidates, plus the context continuation (up to k - 1 = 3 tokens) on top of them
    assert trees and all(tree.num_drafts <= 4 + 3 for tree in trees) and any(tree.num_drafts == 4 for tree in trees)
    trees.clear()
    rows = prompt.repeat(2, 1)
    assert torch.equal(mtp(model, rows, max_new_tokens=6, pad_token_id=2).sequences,
                       greedy(model, rows, max_new_tokens=6, pad_token_id=2))
    assert mtp(model, prompt, max_new_tokens=6, do_sample=True).sequences.shape == (1, 10)
    assert not trees
    model.generation_config.draft_tree_size = "big"
    with pytest.raises(ValueError, match="draft_tree_size='big'"):
        mtp(model, prompt, max_new_tokens=5)


def test_a_default_tree_size_is_saved_and_shown_on_the_card(tmp_path):
    from transformers import AutoModelForCausalLM

    from transformers_mtp.model_card import render_model_card

    model = transformers_mtp.convert(tiny_base("llama"), num_heads=4, head_type="linear", draft_tree_size=6)
    randomize_heads(model, 0)
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert loaded.generation_config.draft_tree_size == 6
    prompt = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    assert torch.equal(mtp(loaded, prompt, max_new_tokens=20).sequences, greedy(loaded, prompt, max_new_tokens=20))
    assert "drafts a tree of 6 candidate tokens per step" in str(render_model_card(loaded, base_model=None, training="none"))
    with pytest.raises(ValueError, match="draft_tree_size=-2 must be an integer from 0 to 64"):
        transformers_mtp.convert(tiny_base("llama"), num_heads=4, draft_tree_size=-2)
