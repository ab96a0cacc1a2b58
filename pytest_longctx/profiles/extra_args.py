"""What a profile's ``[serving] extra_args`` tell vLLM about its KV cache, as the plan reads them.

The command line is built in ``serving/vllm_command.py``; the plan, below it, must read the
flags that change what the cache holds (block size, chunk size, prefix caching, the hybrid
allocator, Mamba state dtypes, prefill context parallel) and refuse those a profile key owns, so
that the capacity it predicts is the one vLLM will run with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_longctx.profiles.profile import ProfileError, ServingSpec

#: vLLM flags a profile has its own key for: in ``extra_args`` they would bypass the plan.
PROFILE_KEY_FLAGS: Mapping[str, str] = {
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--data-parallel-size": "data_parallel_size",
    "-dp": "data_parallel_size",
    "--decode-context-parallel-size": "decode_context_parallel_size",
    "-dcp": "decode_context_parallel_size",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--dtype": "dtype",
    "--kv-cache-memory-bytes": "kv_cache_memory",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-num-seqs": "max_num_seqs",
    "--attention-backend": "attention_backend",
}


@dataclass(frozen=True)
class CacheFlags:
    """The ``extra_args`` flags that change what vLLM's KV cache holds, as the plan reads them."""

    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    hybrid_allocator: bool = True
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    prefill_context_parallel_size: int = 1


_VALUE_FLAGS = {
    "--block-size": "block_size",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--mamba-cache-dtype": "mamba_cache_dtype",
    "--mamba-ssm-cache-dtype": "mamba_ssm_cache_dtype",
    "--prefill-context-parallel-size": "prefill_context_parallel_size",
    "-pcp": "prefill_context_parallel_size",
}
_INT_FIELDS = ("block_size", "max_num_batched_tokens", "prefill_context_parallel_size")


def cache_flags(serving: ServingSpec, where: str = "profile") -> CacheFlags:
    """Read the cache-shaping flags of ``extra_args``; refuse those a profile key owns."""
    args = list(serving.extra_args)
    values: dict[str, object] = {}
    i = 0
    while i < len(args):
        flag, _, inline = args[i].partition("=")
        if flag in PROFILE_KEY_FLAGS:
            raise ProfileError(
                f"{where}: [serving] extra_args passes {flag}; set [serving] "
                f"{PROFILE_KEY_FLAGS[flag]} instead, so the capacity plan sizes what vLLM runs"
            )
        if flag in _VALUE_FLAGS:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if inline else 1
            name = _VALUE_FLAGS[flag]
            if name in _INT_FIELDS:
                if not value.isdigit() or int(value) < 1:
                    raise ProfileError(
                        f"{where}: [serving] extra_args {flag} {value!r} must be a positive integer"
                    )
                values[name] = int(value)
            else:
                values[name] = value
        elif flag == "--no-enable-prefix-caching":
            values["prefix_caching"] = False
        elif flag == "--enable-prefix-caching":
            values["prefix_caching"] = True
        elif flag == "--disable-hybrid-kv-cache-manager":
            values["hybrid_allocator"] = False
        i += 1
    return CacheFlags(**values)  # type: ignore[arg-type]
