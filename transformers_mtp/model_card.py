# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Model cards for converted models, rendered from `model_cards/` with huggingface_hub's `ModelCard`, and their
"Measured" section, formatted from the JSON that `transformers-mtp bench` writes."""

import json
import re
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

# installed: transformers_mtp/model_cards/ (setup.py maps the repository's top-level model_cards/ there);
# a source checkout or an editable install: the top-level model_cards/ itself
TEMPLATE = next(
    (path for path in (Path(__file__).resolve().parent / "model_cards" / "multi_token_model.md",
                       Path(__file__).resolve().parent.parent / "model_cards" / "multi_token_model.md")
     if path.exists()),
    Path(__file__).resolve().parent.parent / "model_cards" / "multi_token_model.md",
)
UNTRAINED = "none yet: the heads are freshly initialised (identity maps / copies of the last layer)"
NOT_MEASURED = "Not measured yet for this checkpoint."
# the usage snippet's repo id in a card rendered before the Hub repo is known; `push_to_hub` fills in the real one
PLACEHOLDER_REPO_ID = "path/to/this/folder"
CARD_TAGS = ["custom_code", "multi-token-prediction", "transformers-mtp"]
MODE_LABELS = {
    "verified": "verified multi-token",
    "unverified": "unverified multi-token (lossy)",
    "prompt_lookup": "transformers prompt lookup",
    "verified_sample": "multi-token speculative sampling (vs plain sampling)",
}
_SUMMARY_KEYS = {"mode", "k", "kind", "prompts", "speedup", "tokens_per_forward", "exact_match_rate"}


def render_model_card(model, *, base_model, repo_id=None, license=None, training=UNTRAINED,
                      measurements=NOT_MEASURED) -> ModelCard:
    """The card of a converted model: YAML metadata (base_model, license inherited from the base model, tags
    `custom_code` and `multi-token-prediction`) and a body with the head settings and a usage snippet.

    `model` only needs `.config` (num_heads, head_type) and `.generation_config`; `base_model=None` leaves the
    base model out of the metadata (a folder that does not record it)."""
    config = model.config
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license,
        tags=list(CARD_TAGS),
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=repo_id or (f"{base_model} + multi-token heads" if base_model else "Multi-token model"),
        repo_id=repo_id or PLACEHOLDER_REPO_ID,
        base_model=base_model,
        num_heads=config.num_heads,
        num_predict_heads=getattr(model.generation_config, "num_predict_heads", None) or config.num_heads,
        head_type=config.head_type,
        head_input=config.head_input,
        draft_datastore_size=getattr(config, "draft_datastore_size", None),
        draft_tree_size=getattr(model.generation_config, "draft_tree_size", None) or 0,
        training=training,
        measurements=measurements,
    )


def read_bench_json(path):
    """The dict `transformers-mtp bench` wrote to `path` (bench.json), checked to have the summary rows we format."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"bench JSON {str(path)!r} does not exist; run `transformers-mtp bench --model "
                                "MODEL_DIR --output-dir OUT` and pass OUT/bench.json.")
    try:
        bench = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not valid JSON ({error}); pass the bench.json written by "
                         "`transformers-mtp bench`.") from None
    summary = bench.get("summary") if isinstance(bench, dict) else None
    if not isinstance(summary, list) or not all(isinstance(r, dict) and _SUMMARY_KEYS <= r.keys() for r in summary):
        raise ValueError(f"{str(path)!r} is not a transformers-mtp bench JSON: it needs a 'summary' list of rows with "
                         f"{sorted(_SUMMARY_KEYS)}; pass the bench.json written by `transformers-mtp bench`.")
    if not any(row["mode"] != "greedy" for row in summary):
        raise ValueError(f"{str(path)!r} measures plain greedy decoding only; run `transformers-mtp bench` with at "
                         "least one of --modes verified / unverified / prompt_lookup.")
    return bench


def _hardware(environment):
    device = environment.get("device")
    if not device:
        return "hardware not recorded"
    detail = [environment.get("processor") or environment.get("machine") or ""]
    if environment.get("threads"):
        detail.append(f"{environment['threads']} threads")
    detail = ", ".join(d for d in detail if d)
    return f"{device} ({detail})" if detail else str(device)


def format_measurements(bench) -> str:
    """Markdown for the card's "Measured" section from a bench JSON dict: per mode, k and prompt kind, tokens per base
    forward pass, the tokens/s ratio against plain greedy on the same prompt (median [min, max]), per-head acceptance
    and the exact-match rate against greedy, with the hardware and dtype. Plain greedy rows (1.00 by definition) are
    left out."""
    environment = bench.get("environment") or {}
    rows = [row for row in bench["summary"] if row["mode"] not in ("greedy", "sample")]
    kinds = {row["kind"]: row["prompts"] for row in bench["summary"]
             if row["mode"] == "greedy" and row["kind"] != "all"}
    total = next((row["prompts"] for row in bench["summary"] if row["kind"] == "all"), None)
    prompts = f"{total} prompts" if total else "the prompts"
    if kinds:
        prompts += " (" + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) + ")"
    software = ", ".join(f"{name} {environment[name]}" for name in ("torch",) if environment.get(name))
    lines = [
        f"Measured with `transformers-mtp bench` on {_hardware(environment)}, "
        f"{environment.get('dtype') or 'dtype not recorded'}{', ' + software if software else ''}: {prompts}, "
        f"{bench.get('max_new_tokens', '?')} new tokens at most, each mode run back to back with plain greedy "
        "decoding of the same prompt in one process, after a warm-up.",
    ]
    if environment.get("model"):
        lines[0] += f" Model: {environment['model']}."
    lines += [
        "",
        "| mode | prompts | k | tokens per forward pass | tokens/s vs plain greedy (or sampling), median [min, max] "
        "| head acceptance | identical to greedy |",
        "|---|---|---|---|---|---|---|",
    ]
    several_dtypes = len({row.get("dtype") for row in rows}) > 1  # `bench --dtype float32 bfloat16`
    for row in rows:
        speedup = row["speedup"] or {}
        spread = (f"{speedup['median']:.2f}x [{speedup['min']:.2f}, {speedup['max']:.2f}]"
                  if {"median", "min", "max"} <= speedup.keys() else "-")
        acceptance = " / ".join(f"{a:.2f}" for a in row.get("head_acceptance") or []) or "-"
        label = MODE_LABELS.get(row["mode"], row["mode"])
        if row.get("threshold"):
            label += f", draft confidence >= {row['threshold']:g}"
        if row.get("lookup"):
            label += f", context lookup up to {row['lookup']}-grams"
        if row.get("tree_size"):
            label += f", draft tree of {row['tree_size']} tokens"
        if several_dtypes:  # each row against plain greedy of its own dtype
            label = f"{row['dtype']}: {label}"
        identical = "-" if row.get("exact_match_rate") is None else f"{row['exact_match_rate']:.0%}"
        lines.append(f"| {label} | {row['kind']} ({row['prompts']}) | {row['k']} "
                     f"| {row['tokens_per_forward']:.2f} | {spread} | {acceptance} | {identical} |")
    lines += ["", "Head acceptance is per step: head i counts only when heads 1 to i-1 were also right. The unverified "
                  "mode is not greedy-identical; read its speed next to its exact-match rate."]
    return "\n".join(lines)


def set_measured_section(text, measurements) -> str:
    """`text` (a card's Markdown body) with the body of its "## Measured" section replaced, or the section appended."""
    heading = re.search(r"^## Measured[ \t]*\n", text, flags=re.MULTILINE)
    if heading is None:
        return text.rstrip("\n") + f"\n\n## Measured\n\n{measurements}\n"
    after = re.search(r"^## ", text[heading.end():], flags=re.MULTILINE)
    end = heading.end() + after.start() if after else len(text)
    return f"{text[:heading.end()]}\n{measurements}\n" + ("\n" + text[end:] if after else "")
