"""Build a tier's speculator: load or derive the draft model, size its KV pool, wire it up.

Wiring goes through public ways in only: the draft model shares the target's embedding via
`share_embedding_with`, and the speculator joins the target runner's forwards via its hooks
(`Speculator.attach`)."""

from __future__ import annotations

import logging

import torch

from engines.errors import ModelLoadError
from engines.kv_cache import KVPool
from engines.loaded_model import LoadedModel, load_model, move_model
from engines.model_runner import ModelRunner
from engines.quantization import quantize_model
from engines.sampler import Sampler
from engines.spec.config import SpeculativeConfig
from engines.spec.model_draft import ModelDraftSource
from engines.spec.ngram import NgramSource
from engines.spec.speculator import Speculator
from engines.stats import EngineStats

log = logging.getLogger(__name__)

SELF_DRAFT_QUANTIZATIONS = ("int4-rtn", "int8", "fp8", "w8a8", "w4a8")


def load_draft_model(spec: SpeculativeConfig, target: LoadedModel, max_model_len: int) -> LoadedModel | None:
    """The draft model of a "draft" or "self" config (None for "ngram"), checked against the target.

    "self": the target's own checkpoint with quantized weights (`draft_quantization`), or,
    when `draft_model` names one, a quantized copy built beforehand (e.g. by `tiergate
    quantize --method int4-awq`). "draft": another model sharing the target's tokenizer.
    """
    if spec.method == "ngram":
        return None
    if spec.method == "self" and not spec.draft_model:
        if spec.draft_quantization not in SELF_DRAFT_QUANTIZATIONS:
            raise ModelLoadError(f"self-draft quantization {spec.draft_quantization!r} is not built in-process; "
                             f"choose one of {SELF_DRAFT_QUANTIZATIONS}, or quantize with `tiergate quantize` "
                             "and pass the artifact as draft_model")
        if target.quantization is not None:
            # Its checkpoint is already the quantized artifact: a "self" draft of it would be the
            # target again (as slow to run), and its INT4 layers could not be re-quantized.
            raise ModelLoadError(f"self-speculation needs an unquantized target, but this tier runs "
                                 f"{target.quantization} weights; use method 'ngram', or 'draft' with draft_model")
        # Quantized on the CPU (the INT4 CPU pack is a CPU op), then moved to the target's device.
        draft = load_model(target.path, target.dtype)
        quantize_model(draft.model, spec.draft_quantization, spec.draft_group_size, progress=False)
        move_model(draft.model, target.device)
        draft.quantization = f"{spec.draft_quantization}-g{spec.draft_group_size}"
        # The self-draft keeps the target's (unquantized) embedding and tied head: one copy.
        draft.model.share_embedding_with(target.model)
    else:
        draft = load_model(spec.draft_model, target.dtype, device=target.device)
    if draft.config.vocab_size != target.config.vocab_size or \
            draft.tokenizer.backend.get_vocab() != target.tokenizer.backend.get_vocab():
        raise ModelLoadError(f"draft model {draft.name} does not share the target's tokenizer")
    if draft.config.max_position_embeddings < max_model_len:
        raise ModelLoadError(f"draft model {draft.name} handles {draft.config.max_position_embeddings} positions, "
                         f"fewer than the engine's context length {max_model_len}")
    log.info("speculative draft: %s (%s, %s)", draft.name, draft.dtype, draft.quantization or "unquantized")
    return draft


def build_speculator(spec: SpeculativeConfig, draft: LoadedModel | None, draft_kv_dtype: torch.dtype | None,
                     num_blocks: int, block_size: int, sampler: Sampler, stats: EngineStats, max_model_len: int,
                     max_catchup_tokens: int, target_runner: ModelRunner) -> Speculator:
    if spec.method == "ngram":
        source = NgramSource(spec.ngram_min, spec.ngram_max)
    else:
        # Same number and size of blocks as the target pool: the draft uses its block tables.
        pool = KVPool(draft.config, num_blocks, block_size, draft_kv_dtype, device=draft.device)
        mirrored = spec.method == "self" and draft.config == target_runner.model.config
        source = ModelDraftSource(spec.method, draft.model, pool, sampler, max_catchup_tokens, mirrored)
    speculator = Speculator(spec, source, sampler, stats, max_model_len)
    speculator.attach(target_runner)
    return speculator
