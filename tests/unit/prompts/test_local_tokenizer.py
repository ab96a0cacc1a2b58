"""A local tokenizer read without transformers: the same ids, counts and text as
``AutoTokenizer`` (what vLLM itself loads), and no torch in the session that builds prompts.

Each comparison runs in a Python of its own: transformers imports torch, which a pytester
session of this process would not survive.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from server_pool import embedded_model

from pytest_longctx.prompts.builder import LocalTokenSource, plain_tokenizer_file

COMPARE = r"""
import json, sys
from pytest_longctx.prompts.builder import LocalTokenSource
from pytest_longctx.prompts.corpus import generate_corpus
from pytest_longctx.prompts.needle import QUESTION_TOKEN, keyed_needle_token, needle_token

folder = sys.argv[1]
text = generate_corpus(60_000, seed=7)
# special and added tokens written out in text, spaces, digits and a pass key
text += " <|bos|> x" + keyed_needle_token(0, 5) + " 12345 " + needle_token(9) + QUESTION_TOKEN
text += "\n\n  é中 tab\tend"
plain = LocalTokenSource(folder)
assert plain.plain is not None, "a plain tokenizer.json is read by the tokenizers library"
ids = plain.encode(text)
figures = {
    "plain_imports_torch": "torch" in sys.modules,
    "plain": [ids, plain.count_as_server(text), plain.vocab_size(), plain.decode(ids[:4000])],
}
auto = LocalTokenSource(folder)
auto._plain = False  # the transformers path, as for any other tokenizer
auto_ids = auto.encode(text)
figures["auto"] = [auto_ids, auto.count_as_server(text), auto.vocab_size(), auto.decode(ids[:4000])]
print(json.dumps(figures))
"""


def _compare(folder: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", COMPARE, str(folder)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_plain_tokenizer_reads_as_transformers_does_without_torch() -> None:
    figures = _compare(embedded_model("tiny-llama"))
    assert figures["plain_imports_torch"] is False
    plain, auto = figures["plain"], figures["auto"]
    assert len(plain[0]) > 10_000  # the corpus sample is long enough to mean something
    assert plain == auto  # ids, count with BOS, vocabulary with added tokens, decoded text


def test_a_config_that_changes_the_tokenizer_keeps_transformers(tmp_path: Path) -> None:
    """``add_bos_token``, ``legacy``, remote code, another class, truncation in the file:
    transformers may rebuild such a tokenizer on load, so it loads it."""
    source = embedded_model("tiny-llama")
    assert plain_tokenizer_file(source) == source / "tokenizer.json"
    config = json.loads((source / "tokenizer_config.json").read_text())
    for change in (
        {"add_bos_token": False},
        {"legacy": False},
        {"auto_map": {"AutoTokenizer": ["x.Tok", None]}},
        {"tokenizer_class": "LlamaTokenizerFast"},
    ):
        folder = tmp_path / "changed"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert plain_tokenizer_file(folder) is None, change
    body = json.loads((source / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(json.dumps({**body, "truncation": {"max_length": 8}}))
    assert plain_tokenizer_file(folder) is None
    assert plain_tokenizer_file(tmp_path / "missing") is None
    # a Hub name at a revision is never read as a folder
    assert LocalTokenSource(str(source), revision="main").plain is None
