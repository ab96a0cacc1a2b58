"""Helpers shared by the plugin's own tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_longctx.core.records import Record, read_records

REPO = Path(__file__).resolve().parents[1]
SWEEP_TEST = (REPO / "tests" / "test_sweep.py").read_text(encoding="utf-8")


def run_folder(output: Path) -> Path:
    latest = output / "latest"
    assert latest.is_symlink(), f"no run folder under {output}"
    return latest.resolve()


def records_of(output: Path) -> list[Record]:
    result = read_records(run_folder(output) / "results.jsonl")
    assert not result.problems, result.problems
    return list(result.records)


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_session(pytester, *args: str, url: str | None = None, timeout: float = 600):  # noqa: ANN001, ANN201
    """A pytest session in its own process, as a user runs one, writing under ``reports/``.

    Returns the run result and the output root. With ``url`` it attaches to that server.
    """
    output = pytester.path / "reports"
    attach = [f"--longctx-url={url}"] if url else []
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--longctx-output={output}", *attach, *args, timeout=timeout
    )
    return result, output


@dataclass
class FaultAfterWarmUp:
    """Switches a fake server's fault on as the first item runs, after the warm-up prompts
    (the first three completions); or stops the server there."""

    fake: Any
    changes: dict[str, Any]
    stop_server: bool = False

    def pytest_runtest_call(self, item: Any) -> None:
        if self.stop_server:
            self.fake.stop()
        else:
            self.fake.configure(**self.changes)


def fault_session(pytester, fake):  # noqa: ANN001, ANN201
    """Runs the sweep in-process attached to the fake server; ``run(*args, **changes)``
    returns the result and the records, the changes made after the warm-up."""
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    output = pytester.path / "reports"

    def run(*args: str, stop_server: bool = False, **changes: Any):  # noqa: ANN202
        result = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            f"--longctx-url={fake.url}",
            f"--longctx-output={output}",
            "--longctx-decode-tokens=8",
            *args,
            plugins=[FaultAfterWarmUp(fake, changes, stop_server)],
        )
        return result, records_of(output)

    return run


def fine_grained_qwen_spec():  # noqa: ANN201 - an EmbeddedModelSpec
    """A model no profile describes: Qwen2 architecture, and a byte-level tokenizer of only
    320 tokens, which splits text (digits above all) into many small tokens."""
    from pytest_longctx.serving.embedded import (
        MAX_POSITION_EMBEDDINGS,
        ROPE_THETA,
        EmbeddedModelSpec,
    )

    return EmbeddedModelSpec(
        name="tiny-qwen-fine",
        architecture="Qwen2ForCausalLM",
        config={
            "model_type": "qwen2",
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "initializer_range": 0.02,
        },
        vocab_size=320,
        corpus_chars=300_000,
        description="Qwen2-style, 2 layers, GQA, a 320-token byte-level BPE",
    )


@contextlib.contextmanager
def serving(profile, model_path: str, max_model_len: int, log_dir: Path) -> Iterator[str]:  # noqa: ANN001
    """A real vLLM server of ``profile`` for the ``with`` block: its base URL, then stopped."""
    from pytest_longctx.serving.process import LaunchedServer, free_port
    from pytest_longctx.serving.vllm_command import build_server_command

    command = build_server_command(
        profile,
        model_path=model_path,
        tokenizer_path=None,
        max_model_len=max_model_len,
        port=free_port(),
    )
    server = LaunchedServer(command, log_dir / "server.log", startup_timeout_s=600)
    server.start()
    try:
        server.wait_ready()
        yield server.base_url
    finally:
        server.stop()
