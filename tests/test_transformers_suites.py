"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) run against our multi-token classes.

The test files come from the installed transformers release (see tests/transformers_suite.py: the sdist on PyPI,
fetched once into a cache folder); only the model testers (tiny configs and inputs) are ours. Their sizes follow
transformers' Llama / GPT-2 model testers: batch 13, sequence 7, vocabulary 99, hidden 32, 2 layers, 4 attention
heads (Llama: 2 key/value heads), intermediate 37; GPT-2 inputs carry `token_type_ids` (as transformers' GPT-2
tester), Llama's a right-padding `attention_mask`.

Classes: architecture (Llama, GPT-2, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3) x head design (linear, resblock, query_extension, and query_extension with
head_input="sequential", head_input="feature_and_token" or head_share_kv=False; the chained drafter on Llama, Mistral
and Qwen2): every design on Llama and GPT-2, the architecture-dependent ones (`DESIGNS_BEYOND_GENERIC`) on the
others; each twice:

- `...Test`: the common inputs as transformers' testers make them. Without `labels` our forward is the base model's,
  so the heads run only in the loss / training tests.
- `...HeadPathTest`: the same inputs plus `output_head_logits=True`, so every forward also runs the heads.

Controls: the plain base classes (`LlamaForCausalLM`, `GPT2LMHeadModel`, ...) under the same harness; a failure seen there too is the
harness's (or transformers'), not ours.

Expected outcomes live in `expectations()` below: deliberate deviations are skips naming the reason. A known bug of
ours would be an `xfail(strict=True, raises=...)` naming it (none is listed now), so that its fix shows up as an
XPASS failure and the entry is removed.
"""

import collections
import contextlib
import functools
import unittest
from unittest import mock

import pytest
import torch
import transformers_suite
from conftest import ARCHS  # the generic architectures: llama, gpt2
from transformers import (
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

from transformers_mtp.modeling_multi_token import MULTI_TOKEN_CLASSES

try:
    common, configuration, SUITE_DIR = transformers_suite.import_suite()
except transformers_suite.SuiteUnavailable as error:
    if transformers_suite.required():  # CI: a missing suite is an error, never a silent skip
        raise
    pytest.skip(f"transformers' common test suite is unavailable: {error}", allow_module_level=True)

VERSION = transformers_suite.transformers_version()
ModelTesterMixin = common.ModelTesterMixin
GenerationTesterMixin = common.GenerationTesterMixin  # a placeholder when the sdist lacks generation/test_utils.py
ConfigTester = configuration.ConfigTester
ids_tensor = common.ids_tensor

# Harness: transformers tells a causal LM by its class name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (it then adds
# `labels` for the loss tests, checks `shift_labels`, ...); classes registered at run time are not in it. Rebind the
# name inside the imported test module only: transformers' own mapping is left alone.
common.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = collections.OrderedDict(
    [
        *common.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items(),
        *((ours.config_class.model_type, ours.__name__) for ours in MULTI_TOKEN_CLASSES.values()),
    ]
)


class TinyCausalLMTester:
    """Our model tester: a tiny config of `config_class` and random inputs (transformers' tester interface)."""

    batch_size = 13
    seq_length = 7
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    num_key_value_heads = 2
    intermediate_size = 37
    max_position_embeddings = 512
    type_vocab_size = 16
    initializer_range = 0.02
    is_training = True
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __init__(self, parent, arch, config_class, extra_inputs=None, **config_extra):
        self.parent = parent
        self.arch = arch
        self.config_class = config_class
        self.config_extra = config_extra
        self.extra_inputs = extra_inputs or {}
        self.use_input_mask = arch != "gpt2"
        self.use_token_type_ids = arch == "gpt2"

    def get_config(self):
        tokens = dict(pad_token_id=self.pad_token_id, bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id)
        if self.arch != "gpt2":  # the Llama family
            sizes = dict(
                vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                intermediate_size=self.intermediate_size, hidden_act="gelu",
                max_position_embeddings=self.max_position_embeddings, initializer_range=self.initializer_range,
            )
            if self.arch in ("mistral", "qwen3", "gemma2", "gemma3"):  # head_dim is a field of its own (Qwen3's defaults to 128)
                sizes["head_dim"] = self.hidden_size // self.num_attention_heads
        else:
            sizes = dict(
                vocab_size=self.vocab_size, n_embd=self.hidden_size, n_layer=self.num_hidden_layers,
                n_head=self.num_attention_heads, n_inner=self.intermediate_size, activation_function="gelu",
                n_positions=self.max_position_embeddings, initializer_range=self.initializer_range,
            )
        return self.config_class(**sizes, **tokens, **self.config_extra)

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids}
        if self.use_input_mask:  # row i keeps its first i + 1 tokens (right padding), as transformers' testers
            inputs["attention_mask"] = torch.tril(torch.ones_like(input_ids))
        if self.use_token_type_ids:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        return self.get_config(), {**inputs, **self.extra_inputs}

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class _SuiteBase(ModelTesterMixin, GenerationTesterMixin):
    """transformers' ModelTesterMixin (+ the release's GenerationTesterMixin, or its placeholder) and the
    ConfigTester checks, for one model class. Subclasses set arch, model_class, config_class, config_extra."""

    arch = None
    model_class = None
    config_class = None
    config_extra = {}
    extra_inputs = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.model_class is not None:
            cls.all_model_classes = (cls.model_class,)

    def setUp(self):
        self.model_tester = TinyCausalLMTester(
            self, self.arch, self.config_class, extra_inputs=self.extra_inputs, **self.config_extra
        )
        # non-default sizes (transformers' own 37 is not a multiple of the default number of attention heads)
        size = {"hidden_size": 64, "num_attention_heads": 4} if self.arch != "gpt2" else {"n_embd": 64, "n_head": 4}
        self.config_tester = ConfigTester(self, config_class=self.config_class, **size, **self.config_extra)

    # ConfigTester.run_common_tests, one test per check so that each reports on its own
    def test_config_common_properties(self):
        self.config_tester.create_and_test_config_common_properties()

    def test_config_to_json_string(self):
        self.config_tester.create_and_test_config_to_json_string()

    def test_config_to_json_file(self):
        self.config_tester.create_and_test_config_to_json_file()

    def test_config_from_and_save_pretrained(self):
        self.config_tester.create_and_test_config_from_and_save_pretrained()
        self.config_tester.create_and_test_config_from_and_save_pretrained_subfolder()
        self.config_tester.create_and_test_config_from_and_save_pretrained_composite()
        self.config_tester.create_and_test_config_from_pretrained_custom_kwargs()

    def test_config_with_num_labels(self):
        self.config_tester.create_and_test_config_with_num_labels()

    def test_config_can_be_init_without_params(self):
        self.config_tester.check_config_can_be_init_without_params()

    def test_config_arguments_init(self):
        if configuration.config_common_kwargs is None:  # the placeholder of tests/utils/test_configuration_utils.py
            self.skipTest(transformers_suite.CONFIG_KWARGS_UNAVAILABLE.format(version=VERSION))
        self.config_tester.check_config_arguments_init()


# the architectures: (class-name prefix of ours, tester arch, base class)
BASE_CLASSES = (("Llama", "llama", LlamaForCausalLM), ("GPT2", "gpt2", GPT2LMHeadModel),
                ("Mistral", "mistral", MistralForCausalLM), ("Qwen2", "qwen2", Qwen2ForCausalLM),
                ("Qwen3", "qwen3", Qwen3ForCausalLM), ("Gemma2", "gemma2", Gemma2ForCausalLM),
                ("Gemma3", "gemma3", Gemma3ForCausalLM))

# --- controls: the unmodified base classes (LlamaForCausalLMControlTest, ..., Gemma3ForCausalLMControlTest) ---------
for _name, _arch, _base in BASE_CLASSES:
    _control = f"{_base.__name__}ControlTest"
    globals()[_control] = type(_control, (_SuiteBase, unittest.TestCase), {
        "arch": _arch, "model_class": _base, "config_class": _base.config_class, "__module__": __name__,
        "__qualname__": _control,
    })


# --- ours -----------------------------------------------------------------------------------------------------------
def _heads(head_type, **extra):
    # 3 heads: 2 beyond the base model's own (sequences of 7 tokens leave them 5 and 4 scored positions)
    return {"num_heads": 3, "head_type": head_type, "head_rank": 4, **extra}


# class-name prefix -> the harness fields of our class for that architecture
ARCHES = {
    name: {"arch": arch, "model_class": MULTI_TOKEN_CLASSES[base], "config_class": MULTI_TOKEN_CLASSES[base].config_class}
    for name, arch, base in BASE_CLASSES
}
HEAD_DESIGNS = {
    "Linear": _heads("linear"),
    "ResBlock": _heads("resblock"),
    "QueryExtension": _heads("query_extension"),
    "QueryExtensionSequential": _heads("query_extension", head_input="sequential"),
    "QueryExtensionToken": _heads("query_extension", head_input="feature_and_token"),
    "QueryExtensionOwnKV": _heads("query_extension", head_share_kv=False),
    "Chained": _heads("chained"),
}
CHAINED_ARCHES = ("llama", "mistral", "qwen2")  # the chained drafter's Llama-style layer (others raise, tested)
HEAD_PATH_INPUTS = {"output_head_logits": True}


# Deliberate deviations
STRICT_LOADING = (
    "deliberate: from_pretrained is strict, it raises ValueError for missing or mis-shaped base weights, and for "
    "missing head weights unless allow_fresh_heads=True, where transformers only reports missing_keys and "
    "initialises them (mtp_heads are then reset by reset_heads, not _init_weights)"
)
SEQUENTIAL_NEEDS_INPUT_IDS = (
    "deliberate: head_input='sequential' / 'feature_and_token' reads the embeddings of the next tokens, so the head "
    "path needs input_ids and raises ValueError for inputs_embeds"
)


def expectations(cls):
    """{test name or name prefix ending in '*': (kind, reason, exception type)} for one of our test classes."""
    head_path = bool(cls.extra_inputs.get("output_head_logits"))
    reads_tokens = cls.config_extra.get("head_input") in ("sequential", "feature_and_token") or (
        cls.config_extra.get("head_type") == "chained")
    out = {
        "test_can_init_all_missing_weights": ("skip", STRICT_LOADING, None),
        "test_correct_missing_keys": ("skip", STRICT_LOADING, None),
        "test_model_weights_reload_no_missing_tied_weights": ("skip", STRICT_LOADING, None),
    }
    if head_path and reads_tokens:
        out["test_inputs_embeds"] = ("skip", SEQUENTIAL_NEEDS_INPUT_IDS, None)
    return out


def _no_subtests(*args, **kwargs):
    return contextlib.nullcontext()


def _apply(cls, name, kind, reason, raises):
    inherited = getattr(cls, name)

    @functools.wraps(inherited)
    def test(self, *args, **kwargs):
        if kind == "xfail":
            # pytest's xfail does not see failures inside self.subTest (they are reported apart and the test
            # XPASSes): run the subtests inline, so the first failure fails the test itself
            with mock.patch.object(self, "subTest", _no_subtests):
                return inherited(self, *args, **kwargs)
        return inherited(self, *args, **kwargs)

    mark = pytest.mark.xfail(strict=True, reason=reason, raises=raises) if kind == "xfail" else pytest.mark.skip(reason)
    setattr(cls, name, mark(test))


def _suite(name, arch_fields, config_extra, extra_inputs):
    cls = type(name, (_SuiteBase, unittest.TestCase), {
        **arch_fields, "config_extra": config_extra, "extra_inputs": extra_inputs, "__module__": __name__,
        "__qualname__": name,
    })
    names = [n for n in dir(cls) if n.startswith("test_")]
    for key, (kind, reason, raises) in expectations(cls).items():
        matches = [n for n in names if n.startswith(key[:-1])] if key.endswith("*") else [key]
        if not matches or any(n not in names for n in matches):
            raise AssertionError(f"{name}: no test {key!r} in transformers {VERSION}'s suite; update expectations()")
        for match in matches:
            _apply(cls, match, kind, reason, raises)
    return cls


# Every head design runs on the generic architectures; the other (Llama-shaped) ones run the designs whose code
# depends on the architecture: the shipped design QueryExtensionToken (its heads copy the last layer, with the
# architecture's norms, rotary embedding and windows), the chained drafter's own layer, and Linear as a control. The
# other designs' modules are the same on every architecture. The whole product (90 classes, 17,072 tests) took 3.8
# minutes of this file on 2 cores, this selection (50 classes, 9,747 tests) 2.3 (a 2-core AMD EPYC, 2026-12-06), for
# a CI that had reached 35 minutes.
DESIGNS_BEYOND_GENERIC = ("Linear", "QueryExtensionToken", "Chained")

# LlamaLinearTest, LlamaLinearHeadPathTest, ..., Qwen3QueryExtensionTokenHeadPathTest
for _arch_name, _arch in ARCHES.items():
    for _design, _config_extra in HEAD_DESIGNS.items():
        if _config_extra["head_type"] == "chained" and _arch["arch"] not in CHAINED_ARCHES:
            continue
        if _arch["arch"] not in ARCHS and _design not in DESIGNS_BEYOND_GENERIC:
            continue
        for _path, _inputs in (("", {}), ("HeadPath", HEAD_PATH_INPUTS)):
            _name = f"{_arch_name}{_design}{_path}Test"
            globals()[_name] = _suite(_name, _arch, _config_extra, _inputs)
