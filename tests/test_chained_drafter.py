"""The chained draft layer (head_type='chained', EAGLE-3 style) on tiny random models: what it reads, that training's
unrolled chain computes what drafting computes, draft trees, training through PEFT and clear errors. Exact output
(greedy, batches, trees, processors, caches) and speculative sampling's distribution are checked with every other
head design, in the suites parametrized over them (conftest.HEAD_SETUPS, test_speculative_sampling.py)."""

import pytest
import torch
from conftest import CHAINED_ARCHS, VOCAB, tiny_base, tiny_mtp

import transformers_mtp
from transformers_mtp.modeling_chained_drafter import chain_attention_mask


def test_config_defaults_to_eagle3_taps_and_checks_them():
    model = tiny_mtp("llama", "chained", randomize=False)
    assert model.config.head_feature_layers == [0, 1]  # 2 layers: the low and middle taps fall together
    assert model.config.to_dict()["head_feature_layers"] == [0, 1]  # persisted in config.json
    assert len(model.mtp_heads) == 1  # one layer drafts every depth
    assert model.mtp_heads[0].fc.in_features == 2 * model.config.hidden_size
    from transformers_mtp.configuration_multi_token import default_feature_layers

    assert default_feature_layers(30) == [2, 15, 27]  # EAGLE-3's low, middle and high layers for 30 layers
    with pytest.raises(ValueError, match="head_feature_layers=\\[0, 2\\].*distinct hidden-state indices from 0"):
        tiny_mtp("llama", "chained", head_feature_layers=[0, 2])
    with pytest.raises(ValueError, match="read by head_type='chained' only"):
        tiny_mtp("llama", "query_extension", head_feature_layers=[0, 1])


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "gemma2", "gemma3"])
def test_unsupported_architectures_get_a_clear_error(arch):
    with pytest.raises(ValueError, match="head_type='chained' drafts with a Llama-style decoder layer.*"
                                         "Use head_type='query_extension'"):
        tiny_mtp(arch, "chained")


def test_untrained_chain_starts_as_the_base_last_layer_on_its_input():
    model = tiny_mtp("llama", "chained", randomize=False)
    ids = torch.randint(3, VOCAB, (1, 9))
    _, layer_input, out = model._trunk_forward(ids, need_layer_input=True, use_cache=False, output_hidden_states=True)
    hidden = out.hidden_states
    assert torch.equal(layer_input, torch.cat([hidden[0], hidden[1]], dim=-1))
    layer = model.mtp_heads[0]
    assert torch.equal(layer.fuse(layer_input), hidden[1])  # the tap nearest the last layer's input passes through


def test_chain_mask_sees_the_text_up_to_each_position_and_the_chain_made_there():
    base = torch.tril(torch.ones(3, 3, dtype=torch.bool))[None, None]
    mask = chain_attention_mask(base, 3)[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1, 0, 0, 1]]
    assert chain_attention_mask(base, 1) is base


@pytest.mark.parametrize("arch", CHAINED_ARCHS)
def test_training_time_test_computes_what_drafting_computes(arch):
    """The unrolled chain at position t (training, forward) equals drafting from t when each step reads the text's
    token: the states training scores are the states drafting uses."""
    model = tiny_mtp(arch, "chained", num_heads=4)
    ids = torch.randint(3, VOCAB, (1, 14), generator=torch.Generator().manual_seed(1))
    normed, layer_input, _ = model._trunk_forward(ids, need_layer_input=True, use_cache=False)
    positions = torch.arange(14)[None]
    next_ids = torch.nn.functional.pad(ids[:, 1:], (0, 1))
    with torch.no_grad():
        unrolled, _ = model._head_states(normed=normed, layer_input=layer_input, next_token_ids=next_ids,
                                         position_ids=positions)  # [1, 14, 3, H]
        for t in (0, 5, 10):
            def text_token(step, state, t=t):
                return ids[:, t + 2 + step : t + 3 + step]

            drafted, _ = model._head_states(normed=normed[:, : t + 1], layer_input=layer_input[:, : t + 1],
                                            next_token_ids=next_ids[:, : t + 1], position_ids=positions[:, : t + 1],
                                            choose_token=text_token, last=torch.tensor([t]))
            assert drafted.shape == (1, 1, 3, model.config.hidden_size)
            torch.testing.assert_close(drafted[0, 0], unrolled[0, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", CHAINED_ARCHS)
def test_drafting_continues_the_cache_of_earlier_steps(arch):
    """Drafting after two verify passes (the chain's cache of the text grown step by step) equals drafting from the
    whole text at once."""
    model = tiny_mtp(arch, "chained", num_heads=3)
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    normed, layer_input, _ = model._trunk_forward(ids, need_layer_input=True, use_cache=False)
    positions, next_ids = torch.arange(12)[None], torch.nn.functional.pad(ids[:, 1:], (0, 1))
    drafted = []

    def choose(step, state):
        drafted.append(state)
        return ids[:, :1]

    with torch.no_grad():
        whole, _ = model._head_states(normed=normed, layer_input=layer_input, next_token_ids=next_ids,
                                      position_ids=positions, choose_token=choose, last=torch.tensor([11]))
        _, past = model._head_states(normed=normed[:, :7], layer_input=layer_input[:, :7],
                                     next_token_ids=next_ids[:, :7], position_ids=positions[:, :7],
                                     choose_token=lambda step, state: None, last=torch.tensor([6]))
        rest, _ = model._head_states(normed=normed[:, 7:], layer_input=layer_input[:, 7:],
                                     next_token_ids=next_ids[:, 7:], position_ids=positions[:, 7:], head_past=past,
                                     choose_token=choose, last=torch.tensor([4]))
    torch.testing.assert_close(rest, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", CHAINED_ARCHS)
def test_draft_trees_branch_and_keep_the_drafter_cache_of_the_accepted_text(arch, monkeypatch):
    """The chained drafter's dynamic trees branch and go several drafts deep, and after each step its own cache
    holds exactly the step-1 keys and values of the text so far (the accepted path's, none of a rejected branch)."""
    from transformers_mtp.generation_proposers import HeadProposer

    model = tiny_mtp(arch, "chained", num_heads=5)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    original, trees, checked = HeadProposer.propose_chain_tree, [], []

    def checking(proposer, state, verified, tree, depth, size):
        tree = original(proposer, state, verified, tree, depth, size)
        trees.append(tree)
        text = state.rows[0][None]
        _, layer_input, _ = model._trunk_forward(text[:, :-1], need_layer_input=True, use_cache=False)
        _, fresh = model._head_states(normed=None, layer_input=layer_input, next_token_ids=text[:, 1:],
                                      position_ids=torch.arange(text.shape[1] - 1)[None], num_heads=2)
        for got, want in zip(proposer.head_past[0], fresh[0]):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        checked.append(True)
        return tree

    monkeypatch.setattr(HeadProposer, "propose_chain_tree", checking)
    expected = model.generate(prompt, max_new_tokens=30, do_sample=False)
    out = model.generate(prompt, max_new_tokens=30, do_sample=False, multi_token_mode=True, draft_tree_size=10,
                         draft_lookup_ngram=0, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert len(checked) >= 5
    assert any(len(children) >= 2 for tree in trees for children in tree.children)
    assert max(max(tree.depths) for tree in trees) >= 2
    # room for every candidate (4 + 3 x 16 at 4 per node, 4 nodes per depth): the tree goes num_heads - 1 deep
    trees.clear()
    out = model.generate(prompt, max_new_tokens=30, do_sample=False, multi_token_mode=True, draft_tree_size=60,
                         draft_lookup_ngram=0)
    assert torch.equal(out, expected)
    assert max(max(tree.depths) for tree in trees) == 4 and max(tree.num_drafts for tree in trees) == 52


def test_peft_trains_lora_and_the_new_parts_and_keeps_the_base(tmp_path):
    from transformers_mtp.training import HeadTrainingConfig, lora_config_for, train_heads
    from peft import get_peft_model

    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="chained", head_rank=4)
    peft_model = get_peft_model(model, lora_config_for(model))
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("o_proj.lora_A" in n for n in trainable) and any("mlp.down_proj.lora_B" in n for n in trainable)
    assert any("fc.modules_to_save" in n for n in trainable) and any("qkv_proj.modules_to_save" in n for n in trainable)
    assert all("mtp_heads" in n for n in trainable)  # nothing of the base
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="chained", head_rank=4)
    before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("mtp_heads.")}
    sequences = []
    for seed in range(16):
        prompt = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(seed))
        out = model.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None)
        sequences.append({"input_ids": out[0].tolist(), "prompt_length": 4})
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=30, per_device_train_batch_size=4,
                                learning_rate=3e-3, eval_steps=30, save_steps=30, logging_steps=10, eval_fraction=0.25)
    merged, metrics = train_heads(model, sequences, config, progress=False)
    assert all(torch.equal(before[k], v) for k, v in merged.state_dict().items() if k in before)
    assert {"eval_agree_head1", "eval_agree_head2"} <= set(metrics)
    prompt = torch.randint(3, VOCAB, (1, 6))
    assert torch.equal(merged.generate(prompt, max_new_tokens=20, do_sample=False, multi_token_mode=True),
                       merged.generate(prompt, max_new_tokens=20, do_sample=False))


@pytest.mark.parametrize("arch", CHAINED_ARCHS)
def test_drafts_ignore_rejected_and_padded_positions(arch):
    """Drafting after a verify pass whose last two positions were rejected (masked out, still cached), and for a row
    with left padding, equals drafting from the text alone."""
    model = tiny_mtp(arch, "chained", num_heads=4)
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    normed, layer_input, _ = model._trunk_forward(ids, need_layer_input=True, use_cache=False)
    positions, next_ids = torch.arange(12)[None], torch.nn.functional.pad(ids[:, 1:], (0, 1))
    every = {"normed": normed, "layer_input": layer_input, "next_token_ids": next_ids, "position_ids": positions}

    def upto(end, start=0):
        return {k: v[:, start:end] for k, v in every.items()}

    def draft(**kwargs):
        return model._head_states(choose_token=lambda step, state: ids[:, step : step + 1], **kwargs)

    with torch.no_grad():
        alone, _ = draft(**upto(10), last=torch.tensor([9]))
        _, past = model._head_states(**upto(7), choose_token=lambda step, state: None, last=torch.tensor([6]))
        mask = torch.ones(1, 12, dtype=torch.long)
        mask[:, 10:] = 0  # positions 10 and 11 were drafted and rejected
        after_rejection, _ = draft(**upto(12, 7), head_past=past, key_padding_mask=mask, last=torch.tensor([2]))
        torch.testing.assert_close(after_rejection, alone, rtol=1e-5, atol=1e-5)
        # the same text after three padding positions (as a left-padded row of a batch)
        _, padded_input, _ = model._trunk_forward(torch.cat([torch.full((1, 3), 2), ids[:, :10]], dim=1),
                                                  attention_mask=torch.tensor([[0] * 3 + [1] * 10]),
                                                  position_ids=torch.tensor([[0] * 3 + list(range(10))]),
                                                  need_layer_input=True, use_cache=False)
        padded, _ = draft(normed=None, layer_input=padded_input, next_token_ids=torch.cat(
            [torch.full((1, 3), 2), next_ids[:, :10]], dim=1), position_ids=torch.tensor([[0] * 3 + list(range(10))]),
            key_padding_mask=torch.tensor([[0] * 3 + [1] * 10]), last=torch.tensor([12]))
        torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)
