# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Model cards for converted models, rendered from `model_cards/` with huggingface_hub's `ModelCard`."""

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

TEMPLATE = Path(__file__).resolve().parent.parent / "model_cards" / "multi_token_model.md"
UNTRAINED = "none yet: the heads are freshly initialised (identity maps / copies of the last layer)"
NOT_MEASURED = "Not measured yet for this checkpoint."


def render_model_card(model, *, base_model, repo_id=None, license=None, training=UNTRAINED,
                      measurements=NOT_MEASURED) -> ModelCard:
    """The card of a converted model: YAML metadata (base_model, license inherited from the base model, tags
    `custom_code` and `multi-token-prediction`) and a body with the head settings and a usage snippet."""
    config = model.config
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license,
        tags=["custom_code", "multi-token-prediction", "transformers-mtp"],
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=repo_id or f"{base_model} + multi-token heads",
        repo_id=repo_id or "path/to/this/folder",
        base_model=base_model,
        num_heads=config.num_heads,
        num_predict_heads=getattr(model.generation_config, "num_predict_heads", config.num_heads),
        head_type=config.head_type,
        training=training,
        measurements=measurements,
    )
