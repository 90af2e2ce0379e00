# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Saving without losing anything: never overwrite a user's folder unless asked, and never leave half a checkpoint."""

import os
import shutil
import tempfile
from pathlib import Path


def save_atomically(model, output_dir, *, tokenizer=None, model_card=None, write_extra=None, overwrite=False):
    """
    `save_pretrained` into a temporary sibling folder, then move it into place in one rename, so an interrupted
    save leaves either the old folder or the complete new one. `model=None`: only what `write_extra(folder)` writes.
    An existing non-empty `output_dir` is an error unless `overwrite=True`.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())) and not overwrite:
        raise FileExistsError(
            f"{str(output_dir)!r} already exists and is not empty; choose another folder or pass overwrite=True "
            "(--overwrite on the command line) to replace it."
        )
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the saved folder gets the usual permissions
    try:
        if model is not None:
            model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if model_card is not None:
            model_card.save(staging / "README.md")
        if write_extra is not None:
            write_extra(staging)
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=output_dir.parent))
            output_dir.rename(old / output_dir.name)
            staging.rename(output_dir)
            shutil.rmtree(old)
        else:
            staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir
