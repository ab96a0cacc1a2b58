"""KV-cache capacity model: will a context length fit before an hours-long prefill starts?

Pure stdlib (plus matplotlib, imported only by :func:`plot_kv_footprint`), so a plan can be
printed on a machine without torch or vLLM and for remote-code models whose ``config.json``
transformers cannot load without their code. A ``config.json`` whose ``model_type``
transformers knows is first read through that config class, as vLLM reads it, in a Python of
its own (``class_config.py``), so the defaults a published file leaves out are counted.

The layout rules follow vLLM's cache code:

* MLA (DeepSeek-V2/V3, Kimi Linear's full-attention layers; the config has ``kv_lora_rank``):
  one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per layer per token, held whole on
  every tensor-parallel rank. More ranks do not shrink it.
* GQA (Llama, Qwen, Mistral): ``2 * max(1, num_key_value_heads // tp) * head_dim`` elements per
  layer per token per rank; once there are more ranks than KV heads, heads are replicated.
* Constant-state linear attention (Kimi Delta Attention): per layer a short-convolution state of
  ``(kernel - 1) * 3 * heads * head_dim`` elements in the model dtype and a recurrent state of
  ``heads * head_dim * head_dim`` float32. vLLM splits the linear-attention heads across ranks
  (it requires ``heads % tp == 0``), so each rank holds ``1 / tp`` of both states; the unsharded
  total is kept too because that is the figure a model card or the study quotes. (Kimi
  Linear's 20 KDA layers: 43,417,600 B unsharded, which is 43.4 MB or 41.4 MiB: the study's
  "~43 MiB" is the decimal figure; 5,427,200 B per rank at TP=8.)

Units: bytes are binary (``GiB`` = 2**30) everywhere. The study's crossovers (6, 48 and 96 GiB at
"~1.6M", "~12.8M" and "~25.6M" tokens) only come out with GiB of bytes and decimal millions of
tokens: 6 GiB / 4032 B = 1,597,831 tokens, whereas 6 GB would give 1,488,096."""

from __future__ import annotations

from .at_once import (
    ConcurrencyFit,
    FitVerdict,
    concurrency_fit,
    fit_verdict,
    pool_blocks,
    render_fit_table,
)
from .fit import (
    Hardware,
    PointFit,
    capacity_table,
    crossover_tokens,
    fit_point,
    render_capacity_table,
    token_capacity,
)
from .kinds import SPARSE_MLA_BACKENDS, sparse_mla_backend_for
from .layout import (
    CACHE_DTYPE_BYTES,
    FP8_CACHE_DTYPE,
    GIB,
    CacheLayout,
    ModelConfigError,
    UnservedModelError,
    cache_element_bytes,
    cache_layout,
    config_model_dtype,
    describe_layout,
    load_model_config,
    model_dtype_name,
    uses_mla,
    uses_sparse_mla,
)
from .parallel import ParallelLayoutError
from .plot import (
    plot_kv_footprint,
)

__all__ = [
    "CACHE_DTYPE_BYTES",
    "CacheLayout",
    "ConcurrencyFit",
    "FitVerdict",
    "FP8_CACHE_DTYPE",
    "GIB",
    "Hardware",
    "ModelConfigError",
    "ParallelLayoutError",
    "PointFit",
    "cache_element_bytes",
    "cache_layout",
    "capacity_table",
    "concurrency_fit",
    "config_model_dtype",
    "crossover_tokens",
    "describe_layout",
    "fit_point",
    "fit_verdict",
    "load_model_config",
    "model_dtype_name",
    "plot_kv_footprint",
    "pool_blocks",
    "render_fit_table",
    "render_capacity_table",
    "SPARSE_MLA_BACKENDS",
    "sparse_mla_backend_for",
    "token_capacity",
    "UnservedModelError",
    "uses_mla",
    "uses_sparse_mla",
]
