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
    #: None: no flag, vLLM's default for the model's kind and release applies.
    prefix_caching: bool | None = None
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
#: vLLM's ``MambaDType`` (``config/cache.py``): what ``--mamba-cache-dtype`` and
#: ``--mamba-ssm-cache-dtype`` accept.
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
_CHOICE_FIELDS = {"mamba_cache_dtype": MAMBA_DTYPES, "mamba_ssm_cache_dtype": MAMBA_DTYPES}
_SWITCHES = {
    "--no-enable-prefix-caching": ("prefix_caching", False),
    "--enable-prefix-caching": ("prefix_caching", True),
    "--disable-hybrid-kv-cache-manager": ("hybrid_allocator", False),
}
_KNOWN_FLAGS = (*PROFILE_KEY_FLAGS, *_VALUE_FLAGS, *_SWITCHES)


def vllm_flag(word: str, where: str = "profile") -> str:
    """The flag vLLM's parser reads ``word`` as, among those the plan knows.

    vLLM's ``FlexibleArgumentParser`` turns underscores into dashes in a ``--`` flag's name
    (up to its first ``.``), so ``--tensor_parallel_size`` is ``--tensor-parallel-size``;
    argparse also takes a flag's leading part alone, which is refused here in favour of the
    whole flag (vLLM reads it as that flag, or as ambiguous)."""
    if not word.startswith("--"):
        return word
    name, dot, rest = word[2:].partition(".")
    flag = f"--{name.replace('_', '-')}{dot}{rest}"
    if flag in _KNOWN_FLAGS:
        return flag
    longer = [known for known in _KNOWN_FLAGS if known.startswith(flag)]
    if longer:
        raise ProfileError(
            f"{where}: [serving] extra_args passes {word}, the start of "
            f"{' and '.join(longer)}; vLLM's parser would take it for "
            f"{'that flag' if len(longer) == 1 else 'any of them'}: write the flag in full"
        )
    return flag


def cache_flags(serving: ServingSpec, where: str = "profile") -> CacheFlags:
    """Read the cache-shaping flags of ``extra_args``; refuse those a profile key owns."""
    args = list(serving.extra_args)
    values: dict[str, object] = {}
    i = 0
    while i < len(args):
        word, _, inline = args[i].partition("=")
        flag = vllm_flag(word, where)
        if flag in PROFILE_KEY_FLAGS:
            raise ProfileError(
                f"{where}: [serving] extra_args passes {word}; set [serving] "
                f"{PROFILE_KEY_FLAGS[flag]} instead, so the capacity plan sizes what vLLM runs"
            )
        if flag in _VALUE_FLAGS:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if inline else 1
            name = _VALUE_FLAGS[flag]
            if name in _INT_FIELDS:
                if not value.isdigit() or int(value) < 1:
                    raise ProfileError(
                        f"{where}: [serving] extra_args {word} {value!r} must be a positive integer"
                    )
                values[name] = int(value)
            elif value not in _CHOICE_FIELDS[name]:
                raise ProfileError(
                    f"{where}: [serving] extra_args {word} {value!r} is not one of vLLM's "
                    f"choices for it: {', '.join(_CHOICE_FIELDS[name])}"
                )
            else:
                values[name] = value
        elif flag in _SWITCHES:
            name, on = _SWITCHES[flag]
            values[name] = on
        i += 1
    return CacheFlags(**values)  # type: ignore[arg-type]
