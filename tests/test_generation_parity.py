"""The generation parity matrix: `generate(multi_token_mode=True)` returns exactly what `generate(do_sample=False)`
returns, for every head design x {llama, gpt2, mistral, qwen2, qwen3} x {batch 1, left-padded batches of 2, 3, 4} x every generate() option
that applies to greedy decoding of a decoder-only model (each logits processor generate() builds from a
GenerationConfig option, a user logits processor list, stop strings, EOS lists, the static cache, continuing from a
returned cache, scores / logits, streamers, short and long max_new_tokens). The logits processors run every head
design on Llama and GPT-2 and the architecture-dependent designs on the others (`processor_cases`).

Two model families per head design:
- "echo": a base model whose greedy continuation mostly repeats its last token (residual branches of every layer
  zeroed, up to a small random attention output; tied embeddings, so logits = norm(e_t) E^T peaks at t), with
  untouched heads (identity maps / copies of the last layer) and no context lookup: the heads draft what the base
  model says, so most drafts are accepted (asserted via `tokens_per_forward`), and the processors that break the
  echo (repetition penalty, n-gram bans, bad words, ...) make it reject some.
- "random": `tiny_mtp` (randomised heads, context lookup on): partial acceptance.

Each test is one (family, arch, head design) and loops over batches and settings; a failing test lists every
failing cell as `family/arch/head batch=B setting: what differed`.
"""

import copy
import functools

import pytest
import torch
from conftest import ALL_ARCHS, ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, tiny_base, tiny_mtp
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    RepetitionPenaltyLogitsProcessor,
    SynthIDTextWatermarkingConfig,
    WatermarkingConfig,
)
from transformers.generation.streamers import BaseStreamer

import transformers_mtp

PAD = 2
PROMPT_LENGTHS = {1: [7], 2: [5, 9], 3: [4, 10, 7], 4: [3, 9, 1, 6]}
BATCHES = tuple(PROMPT_LENGTHS)
LONG = 20  # max_new_tokens of the long settings
FAMILIES = ("echo", "random")
ECHO_NOISE = 0.2  # std of the echo models' attention output projection: drafts are sometimes rejected


# --- models --------------------------------------------------------------------------------------------------------
def echo_base(arch, seed=0, noise=ECHO_NOISE):
    """tiny_base(arch) whose layers only add a small random attention output to the residual stream."""
    base = tiny_base(arch, seed)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        if arch != "gpt2":  # the Llama family
            base.lm_head.weight.copy_(base.model.embed_tokens.weight)
            for layer in base.model.layers:
                layer.mlp.down_proj.weight.zero_()
                out = layer.self_attn.o_proj.weight
                out.copy_(torch.randn(out.shape, generator=generator) * noise)
                if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma norms the attention output to unit scale:
                    layer.post_attention_layernorm.weight.fill_(noise - 1)  # scale it back down, by 1 + weight
        else:  # GPT-2 ties its embeddings already
            base.transformer.wpe.weight.zero_()
            for block in base.transformer.h:
                block.mlp.c_proj.weight.zero_()
                block.mlp.c_proj.bias.zero_()
                block.attn.c_proj.bias.zero_()
                out = block.attn.c_proj.weight
                out.copy_(torch.randn(out.shape, generator=generator) * noise)
    return base


@functools.cache
def model_for(family, arch, head_id):
    head_type, extra = HEAD_SETUPS[HEAD_IDS.index(head_id)]
    if family == "echo":
        model = transformers_mtp.convert(echo_base(arch), num_heads=4, head_type=head_type, draft_lookup_ngram=0,
                                         **extra)
    else:
        model = tiny_mtp(arch, head_type, num_heads=4, **extra)
    return model.eval()


def left_padded(batch):
    """The batch's prompts, left-padded: (input_ids [B, L], attention_mask [B, L])."""
    lengths = PROMPT_LENGTHS[batch]
    generator = torch.Generator().manual_seed(10 + batch)
    width = max(lengths)
    ids = torch.full((batch, width), PAD)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        ids[i, width - length :] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[i, width - length :] = 1
    return ids, mask


# --- a word-level tokenizer over the 99 ids, for stop strings --------------------------------------------------------
@functools.cache
def tokenizer():
    """Ids 3..97 are the strings "03".."97" (so a stop string can span tokens: "1718" is 17 then 18); id 98 is
    "abcdef", which `StopStringCriteria` needs to tokenize to clean the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, **{f"{i:02d}": i for i in range(3, VOCAB - 1)}, "abcdef": VOCAB - 1}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<s>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<s>")


def token_text(token):
    return tokenizer().decode([int(token)])


# --- settings ------------------------------------------------------------------------------------------------------
class BanLastToken(LogitsProcessor):
    """A user processor that reads the sequence: the last token may not repeat (breaks the echo)."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], -1e4)


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ends += 1

    def tokens(self):
        return [t for put in self.puts for t in put]


def distinct(preferred, n, avoid=()):
    """n distinct token ids: those of `preferred` first (in order), then filler ids from 3 up."""
    out = []
    for t in [*map(int, preferred), *range(3, VOCAB)]:
        if t not in out and t not in avoid and t > 2:
            out.append(t)
        if len(out) == n:
            return out
    raise AssertionError("not enough tokens")


class Cell:
    """What a setting needs from the batch: its prompt, and the plain greedy baseline's new tokens [B, LONG]."""

    def __init__(self, batch, ids, mask, baseline):
        self.batch, self.ids, self.mask = batch, ids, mask
        self.new = baseline[:, ids.shape[1] :]

    def early(self, position, rows=None):
        """The baseline's token at `position` of each row (of `rows`), as ints."""
        rows = range(self.batch) if rows is None else rows
        return [int(self.new[i, position]) for i in rows]

    def eos_list(self, length):
        """EOS ids: baseline tokens a few steps in (so rows end early, at different times), `length` of them."""
        return distinct(self.early(3) + self.early(8), length)


def processor_settings(cell):
    """(name, generate() kwargs) of every deterministic logits-processor option of greedy decoder-only generate().
    forced_bos_token_id acts on 1-token prompts only (see the test); renormalize_logits and remove_invalid_values do
    not change greedy tokens, so they run in "combined" (and renormalize_logits in the scores test)."""
    b = cell.batch
    eos = cell.eos_list(b + 1)  # a list whose length is not the batch size
    width = cell.ids.shape[1]
    row0 = cell.new[0].tolist()
    settings = [
        ("no processor", {}),
        ("repetition_penalty=1.5", {"repetition_penalty": 1.5}),
        ("no_repeat_ngram_size=2", {"no_repeat_ngram_size": 2}),
        ("encoder_repetition_penalty=2.0", {"encoder_repetition_penalty": 2.0}),
        ("encoder_no_repeat_ngram_size=1 (bans prompt tokens)", {"encoder_no_repeat_ngram_size": 1}),
        ("bad_words_ids", {"bad_words_ids": [[row0[2]], [row0[5], row0[6]], [row0[9], row0[10], row0[11]]]}),
        ("sequence_bias", {"sequence_bias": [[[row0[1]], -8.0], [[row0[4], row0[5]], -20.0],
                                             [[cell.early(6)[-1]], 4.0]]}),
        (f"min_length=+8, eos={eos}", {"min_length": width + 8, "eos_token_id": eos}),
        (f"min_new_tokens=6, eos={eos}", {"min_new_tokens": 6, "eos_token_id": eos}),
        (f"exponential_decay_length_penalty=(4, 1.8), eos={eos}",
         {"exponential_decay_length_penalty": (4, 1.8), "eos_token_id": eos}),
        ("suppress_tokens (5 ids)", {"suppress_tokens": distinct(cell.early(1) + cell.early(4), 5)}),
        ("begin_suppress_tokens (5 ids)", {"begin_suppress_tokens": distinct(cell.early(0), 5)}),
        ("forced_eos_token_id=5", {"forced_eos_token_id": 5}),
        (f"forced_eos_token_id={eos}", {"forced_eos_token_id": eos}),
        ("watermark lefthash", {"watermarking_config": WatermarkingConfig(bias=4.0, context_width=2)}),
        ("user logits_processor", {"logits_processor": Fresh(lambda: LogitsProcessorList(
            [RepetitionPenaltyLogitsProcessor(1.8), BanLastToken()]))}),
        ("combined", {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 4,
                      "eos_token_id": eos, "suppress_tokens": distinct(cell.early(5), 5),
                      "sequence_bias": [[[row0[3]], -5.0]], "renormalize_logits": True,
                      "remove_invalid_values": True}),
    ]
    if b > 1:  # lists whose length equals the batch size: one list for every row, not one id per row
        eos_b = cell.eos_list(b)
        settings += [
            (f"min_new_tokens=6, eos={eos_b} (len = batch)", {"min_new_tokens": 6, "eos_token_id": eos_b}),
            (f"min_length=+8, eos={eos_b} (len = batch)", {"min_length": width + 8, "eos_token_id": eos_b}),
            (f"suppress_tokens={distinct(cell.early(1), b)} (len = batch)",
             {"suppress_tokens": distinct(cell.early(1), b)}),
            (f"begin_suppress_tokens={distinct(cell.early(0), b)} (len = batch)",
             {"begin_suppress_tokens": distinct(cell.early(0), b)}),
            (f"exponential_decay_length_penalty, eos={eos_b} (len = batch)",
             {"exponential_decay_length_penalty": (4, 1.8), "eos_token_id": eos_b}),
            (f"forced_eos_token_id={eos_b} (len = batch)", {"forced_eos_token_id": eos_b}),
        ]
    return settings


# Options whose processor keeps state across calls (it assumes one call per generated token): multi-token mode must
# either match plain greedy or refuse them with a ValueError naming the option or its processor.
STATEFUL_SETTINGS = [
    ("guidance_scale=1.5", {"guidance_scale": 1.5}, ("guidance_scale", "ClassifierFreeGuidance")),
    ("SynthID watermark", {"watermarking_config": SynthIDTextWatermarkingConfig(
        ngram_len=3, keys=[11, 23, 37, 41, 53, 67], context_history_size=64)}, ("watermarking_config", "SynthID")),
]


class Fresh:
    """A generate() argument built anew for each call (a user processor list may keep state)."""

    def __init__(self, make):
        self.make = make


def materialize(kwargs):
    return {k: v.make() if isinstance(v, Fresh) else v for k, v in kwargs.items()}


# --- comparison helpers ----------------------------------------------------------------------------------------------
def plain(model, ids, **kwargs):
    return model.generate(ids, do_sample=False, **materialize(kwargs))


def multi(model, ids, **kwargs):
    return model.generate(ids, do_sample=False, multi_token_mode=True, **materialize(kwargs))


_REFERENCES = {}


def reference(family, arch, model, batch, name, ids, **kwargs):
    """Plain greedy output, computed once per (family, arch, batch, setting): every head design of a family shares
    the same base model."""
    key = (family, arch, batch, name)
    if key not in _REFERENCES:
        _REFERENCES[key] = plain(model, ids, **kwargs)
    return _REFERENCES[key]


def baseline_cell(family, arch, model, batch):
    ids, mask = left_padded(batch)
    base = reference(family, arch, model, batch, "baseline", ids, attention_mask=mask, max_new_tokens=LONG,
                     eos_token_id=None)
    return Cell(batch, ids, mask, base)


class Failures:
    def __init__(self, family, arch, head_id):
        self.prefix, self.items, self.compared = f"{family}/{arch}/{head_id}", [], 0

    def check(self, batch, name, got, want, detail=""):
        self.compared += 1
        if isinstance(got, BaseException):
            self.items.append(f"{self.prefix} batch={batch} {name}: raised {type(got).__name__}: {str(got)[:300]}")
        elif not torch.equal(got, want):
            self.items.append(f"{self.prefix} batch={batch} {name}: sequences differ{detail}\n"
                              f"    multi-token {got.tolist()}\n    plain       {want.tolist()}")

    def fail(self, batch, name, message):
        self.compared += 1
        self.items.append(f"{self.prefix} batch={batch} {name}: {message}")

    def run(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - a crash is a failing cell, reported with the others
            return error

    def assert_none(self):
        assert not self.items, f"{len(self.items)} of {self.compared} cells fail:\n" + "\n".join(self.items)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one thread is ~8x faster than two on a shared 2-core machine (no contention), and both sides of
    every comparison run under it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


cases = pytest.mark.parametrize(
    "family,arch,head_id", [(f, a, h) for f in FAMILIES for a in ALL_ARCHS for h in HEAD_IDS],
)
# The logits-processor matrix, the dearest test here (about 7 s a cell on one core: 13 settings x 4 batches x 2
# generates), runs every head design on the generic architectures and, on the Llama-shaped ones, the designs whose
# code depends on the architecture: the shipped design (its heads copy the last layer, with the architecture's norms,
# rotary and windows) and the chained drafter's own layer, plus the linear head as a control. How a processor is
# applied is the decode loop's, the same for every architecture; the cache, stop-string, scores and max_new_tokens
# tests below keep the whole matrix.
PROCESSOR_HEADS_BEYOND_GENERIC = ("linear", "qext-token", "chained")
processor_cases = pytest.mark.parametrize(
    "family,arch,head_id",
    [(f, a, h) for f in FAMILIES for a in ALL_ARCHS for h in HEAD_IDS
     if a in ARCHS or h in PROCESSOR_HEADS_BEYOND_GENERIC],
)


# --- the matrix ----------------------------------------------------------------------------------------------------
@processor_cases
def test_logits_processors(family, arch, head_id):
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    for batch in BATCHES:
        cell = baseline_cell(family, arch, model, batch)
        kwargs = dict(attention_mask=cell.mask, max_new_tokens=LONG)
        for name, setting in processor_settings(cell):
            want = reference(family, arch, model, batch, name, cell.ids, **kwargs, **setting)
            failures.check(batch, name, failures.run(multi, model, cell.ids, **kwargs, **setting), want)
        for name, setting, option in STATEFUL_SETTINGS:
            want = reference(family, arch, model, batch, name, cell.ids, **kwargs, **setting)
            got = failures.run(multi, model, cell.ids, **kwargs, **setting)
            if isinstance(got, ValueError) and any(name in str(got) for name in option):
                failures.compared += 1  # refused with a clear message: fine
            else:
                failures.check(batch, name + f" (match plain, or a ValueError naming {' / '.join(option)})", got, want)
    # forced_bos_token_id acts on a 1-token prompt only
    for batch in BATCHES:
        ids = torch.randint(3, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(batch))
        for name, setting in [("1-token prompt", {}), ("1-token prompt, forced_bos_token_id=7",
                                                        {"forced_bos_token_id": 7}),
                              ("1-token prompt, begin_suppress_tokens + forced_bos",
                               {"forced_bos_token_id": 7, "begin_suppress_tokens": [7, int(ids[0, 0]), 50, 60, 70]})]:
            want = reference(family, arch, model, batch, name, ids, max_new_tokens=12, **setting)
            failures.check(batch, name, failures.run(multi, model, ids, max_new_tokens=12, **setting), want)
    failures.assert_none()


@cases
def test_stop_strings(family, arch, head_id):
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    for batch in BATCHES:
        cell = baseline_cell(family, arch, model, batch)
        # one stop string per row, at different depths: a single token's text, and two tokens' joined text
        single = [token_text(cell.new[i, 3 + 2 * i]) for i in range(batch)]
        spanning = [token_text(cell.new[i, 5 + i]) + token_text(cell.new[i, 6 + i]) for i in range(batch)]
        for strings in (single, spanning):
            for eos in ("default eos", None):
                name = f"stop_strings={strings}, eos_token_id={eos}"
                kwargs = dict(attention_mask=cell.mask, max_new_tokens=LONG, stop_strings=strings,
                              tokenizer=tokenizer())
                if eos is None:
                    kwargs["eos_token_id"] = None
                want = reference(family, arch, model, batch, name, cell.ids, **kwargs)
                failures.check(batch, name, failures.run(multi, model, cell.ids, **kwargs), want)
    failures.assert_none()


@cases
def test_static_cache(family, arch, head_id):
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    for batch in BATCHES:
        cell = baseline_cell(family, arch, model, batch)
        for max_new, extra in ((LONG, {}), (2, {}), (LONG, {"repetition_penalty": 1.5})):
            name = f"cache_implementation='static', max_new_tokens={max_new} {extra}"
            kwargs = dict(attention_mask=cell.mask, max_new_tokens=max_new, cache_implementation="static", **extra)
            got = failures.run(multi, model, cell.ids, **kwargs)
            if batch > 1:  # refused: rows accept different numbers of drafts, so a static cache would overflow
                if isinstance(got, ValueError) and "batched multi_token_mode needs a dynamic cache" in str(got):
                    failures.compared += 1
                    continue
                failures.fail(batch, name, f"expected the static-cache ValueError for a batch, got {got!r:.300}")
                continue
            want = reference(family, arch, model, batch, name, cell.ids, **kwargs)
            failures.check(batch, name, got, want)
    failures.assert_none()


@cases
def test_continue_from_cache(family, arch, head_id):
    """generate(out.sequences, cache=out.cache) continues where `out` stopped, whoever produced `out`."""
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    first_new, then_new = 6, 10
    for batch in BATCHES:
        ids, mask = left_padded(batch)
        first = dict(attention_mask=mask, max_new_tokens=first_new, eos_token_id=None, return_dict_in_generate=True)
        mask2 = torch.cat([mask, mask.new_ones((batch, first_new))], dim=1)
        then = dict(attention_mask=mask2, max_new_tokens=then_new, eos_token_id=None)
        key = (family, arch, batch, "continue")
        if key not in _REFERENCES:
            out = plain(model, ids, **first)
            _REFERENCES[key] = (out, plain(model, out.sequences, cache=copy.deepcopy(out.cache), **then))
        plain_first, want = _REFERENCES[key]
        got = failures.run(multi, model, plain_first.sequences, cache=copy.deepcopy(plain_first.cache), **then)
        failures.check(batch, "plain, then multi-token from its cache", got, want)
        multi_first = failures.run(multi, model, ids, **first)
        if isinstance(multi_first, BaseException):
            failures.check(batch, "multi-token first call", multi_first, None)
            continue
        failures.check(batch, "multi-token first call", multi_first.sequences, plain_first.sequences)
        got = failures.run(multi, model, multi_first.sequences, cache=copy.deepcopy(multi_first.cache), **then)
        failures.check(batch, "multi-token, then multi-token from its cache", got, want)
        got = failures.run(plain, model, multi_first.sequences, cache=copy.deepcopy(multi_first.cache), **then)
        failures.check(batch, "multi-token, then plain from its cache", got, want)
    failures.assert_none()


@cases
def test_scores_logits_and_streamer(family, arch, head_id):
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    cell = baseline_cell(family, arch, model, 1)
    eos = cell.eos_list(2)
    settings = [("no processor", {}),
                ("repetition_penalty + renormalize_logits", {"repetition_penalty": 1.5, "renormalize_logits": True}),
                (f"min_new_tokens=6, eos={eos}", {"min_new_tokens": 6, "eos_token_id": eos}),
                ("stop string", {"stop_strings": [token_text(cell.new[0, 4])], "tokenizer": tokenizer()})]
    for name, setting in settings:
        kwargs = dict(attention_mask=cell.mask, max_new_tokens=LONG, **setting)
        # scores and logits
        name_scores = f"output_scores/output_logits, {name}"
        dict_kwargs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, **kwargs)
        want = reference(family, arch, model, 1, name_scores, cell.ids, **dict_kwargs)
        got = failures.run(multi, model, cell.ids, **dict_kwargs)
        if isinstance(got, BaseException):
            failures.check(1, name_scores, got, None)
        else:
            failures.check(1, name_scores, got.sequences, want.sequences)
            for what in ("scores", "logits"):
                mine, theirs = getattr(got, what), getattr(want, what)
                if mine is None or len(mine) != len(theirs):
                    failures.fail(1, name_scores, f"{len(mine or ())} {what}, plain returns {len(theirs)}")
                elif not all(torch.allclose(a, b, atol=1e-5) for a, b in zip(mine, theirs)):
                    failures.fail(1, name_scores, f"{what} differ")
        # streamer
        name_stream = f"streamer, {name}"
        plain_streamer, multi_streamer = RecordingStreamer(), RecordingStreamer()
        plain(model, cell.ids, streamer=plain_streamer, **kwargs)
        got = failures.run(multi, model, cell.ids, streamer=multi_streamer, **kwargs)
        if isinstance(got, BaseException):
            failures.check(1, name_stream, got, None)
        elif multi_streamer.tokens() != plain_streamer.tokens() or multi_streamer.ends != plain_streamer.ends:
            failures.fail(1, name_stream, f"streamed {multi_streamer.tokens()} ({multi_streamer.ends} end calls), "
                                          f"plain streams {plain_streamer.tokens()} ({plain_streamer.ends})")
    # batches: scores / logits / streamers are refused with a clear message
    for batch in BATCHES[1:]:
        ids, mask = left_padded(batch)
        for name, setting, message in [
            ("output_scores", {"output_scores": True}, "scores / logits for batch size 1 only"),
            ("output_logits", {"output_logits": True}, "scores / logits for batch size 1 only"),
            ("streamer", {"streamer": RecordingStreamer()}, "a streamer takes one sequence"),
        ]:
            got = failures.run(multi, model, ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True,
                               **setting)
            if not (isinstance(got, ValueError) and message in str(got)):
                failures.fail(batch, name, f"expected a ValueError saying {message!r}, got {got!r:.300}")
            else:
                failures.compared += 1
    failures.assert_none()


@cases
def test_max_new_tokens_and_acceptance(family, arch, head_id):
    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    accepted = proposed = 0
    for batch in BATCHES:
        cell = baseline_cell(family, arch, model, batch)
        eos = cell.eos_list(batch + 1)
        for max_new, extra in ((1, {}), (2, {}), (3, {"eos_token_id": eos}), (LONG, {}), (LONG, {"eos_token_id": eos}),
                               (LONG, {"eos_token_id": None}), (LONG, {"num_predict_heads": 2})):
            name = f"max_new_tokens={max_new} {extra}"
            kwargs = dict(attention_mask=cell.mask, max_new_tokens=max_new, **extra)
            greedy_extra = {k: v for k, v in extra.items() if k != "num_predict_heads"}  # plain greedy has no heads
            want = reference(family, arch, model, batch, f"max_new_tokens={max_new} {greedy_extra}", cell.ids,
                             attention_mask=cell.mask, max_new_tokens=max_new, **greedy_extra)
            got = failures.run(multi, model, cell.ids, return_dict_in_generate=True, **kwargs)
            if isinstance(got, BaseException):
                failures.check(batch, name, got, want)
                continue
            failures.check(batch, name, got.sequences, want)
            stats = got.multi_token_stats
            accepted, proposed = accepted + sum(stats.head_accepted), proposed + sum(stats.head_proposed)
            if max_new == LONG and not extra and family == "echo":
                # the echo models' heads draft what the base model says: most drafts are kept
                per_row_step = sum(stats.accepted_per_step) / len(stats.accepted_per_step)
                if per_row_step <= 1.5 or (batch == 1 and stats.tokens_per_forward <= 1.5):
                    failures.fail(batch, name, f"echo model accepts too little: {stats.accepted_per_step}, "
                                               f"tokens_per_forward={stats.tokens_per_forward:.2f}")
    assert proposed > 0 and 0 < accepted, (family, arch, head_id, accepted, proposed)
    if family == "random":
        assert accepted < proposed, "random heads never drafted a wrong token: no rejection was exercised"
    failures.assert_none()


@cases
def test_direct_call_of_the_decode_loop(family, arch, head_id):
    """`multi_token_decoding` called as generate() calls it, but without the position_ids generate() prepares: the
    loop derives them from the attention mask (left padding), as generate() does."""
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    from transformers_mtp.generation_multi_token import multi_token_decoding

    model = model_for(family, arch, head_id)
    failures = Failures(family, arch, head_id)
    for batch in BATCHES:
        ids, mask = left_padded(batch)
        want = reference(family, arch, model, batch, "baseline", ids, attention_mask=mask, max_new_tokens=LONG,
                         eos_token_id=None)
        # the generation config as generate() completes it (defaults filled in, special-token tensors set)
        config, _ = model._prepare_generation_config(None, do_sample=False, max_length=ids.shape[1] + LONG,
                                                     eos_token_id=None, pad_token_id=PAD)
        model._prepare_special_tokens(config, True, device=ids.device)
        criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=config.max_length)])
        got = failures.run(multi_token_decoding, model, ids, LogitsProcessorList(), criteria, config,
                           attention_mask=mask, num_predict_heads=4)
        failures.check(batch, "multi_token_decoding(..., attention_mask=mask) without position_ids", got, want)
    failures.assert_none()
