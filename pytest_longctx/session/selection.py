"""Length and repeat comparisons in ``-m`` and ``-k`` (``len<=1Mi``, ``rep==0``).

pytest's expression grammar has no ``<``: each comparison is rewritten to a plain marker name
(``len<=1Mi`` -> ``longctx_len_le_1048576_``) before pytest's own selection runs, and every
sweep item whose point satisfies a comparison carries a marker of that name. The rest of the
expression (``and``/``or``/``not``, parentheses, other marks) is left to pytest. The names are
registered markers, so ``strict_markers``/``strict`` keep working.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from pytest_longctx.core.sizes import ACCEPTED_FORM, SizeError, parse_size

_OPERATORS: dict[str, tuple[str, Callable[[int, int], bool]]] = {
    "<=": ("le", operator.le),
    ">=": ("ge", operator.ge),
    "==": ("eq", operator.eq),
    "!=": ("ne", operator.ne),
    "<": ("lt", operator.lt),
    ">": ("gt", operator.gt),
}
_COMPARISON_RE = re.compile(
    r"(?<![\w.\[=/-])(?P<field>len|rep)\s*(?P<op><=|>=|==|!=|=<|=>|<|>|=)\s*(?P<value>[^\s()]*)"
)
ACCEPTED_EXPRESSION = (
    "len or rep, then one of <, <=, >, >=, ==, !=, then a length for len "
    f'({ACCEPTED_FORM}) or a repeat index for rep, e.g. "len<=1Mi and rep==0"'
)


class SelectionError(ValueError):
    """A comparison in ``-m``/``-k`` that cannot be read."""


@dataclass(frozen=True)
class Comparison:
    field: str  # "len" or "rep"
    op: str  # one of _OPERATORS
    value: int

    @property
    def marker_name(self) -> str:
        # The trailing underscore keeps -k's substring match from confusing 1024 with 10240.
        return f"longctx_{self.field}_{_OPERATORS[self.op][0]}_{self.value}_"

    def holds(self, length: int, repeat: int) -> bool:
        left = length if self.field == "len" else repeat
        return _OPERATORS[self.op][1](left, self.value)

    def __str__(self) -> str:
        return f"{self.field}{self.op}{self.value}"


@dataclass(frozen=True)
class TranslatedExpression:
    text: str
    comparisons: tuple[Comparison, ...]


def translate(expression: str, option: str) -> TranslatedExpression:
    """Rewrite the comparisons of one ``-m``/``-k`` expression; ``option`` names it in errors."""
    comparisons: list[Comparison] = []

    def replace(match: re.Match[str]) -> str:
        if match.group("op") == "=" and _is_keyword_argument(expression, match.start()):
            return match.group(0)  # pytest's own marker keyword: longctx(len=2048)
        comparison = _parse(match, option)
        comparisons.append(comparison)
        return comparison.marker_name

    text = _COMPARISON_RE.sub(replace, expression)
    return TranslatedExpression(text, tuple(dict.fromkeys(comparisons)))


def _is_keyword_argument(expression: str, start: int) -> bool:
    return expression[:start].rstrip().endswith(("(", ","))


def _parse(match: re.Match[str], option: str) -> Comparison:
    field, op, raw = match.group("field"), match.group("op"), match.group("value")
    where = f"{option} {match.string!r}: {match.group(0).strip()!r}"
    if op not in _OPERATORS:
        better = {"=": "==", "=<": "<=", "=>": ">="}[op]
        raise SelectionError(
            f"{where} uses {op!r}; write {better!r}. Accepted: {ACCEPTED_EXPRESSION}"
        )
    if not raw:
        raise SelectionError(f"{where} has nothing after {op!r}. Accepted: {ACCEPTED_EXPRESSION}")
    if field == "len":
        try:
            value = parse_size(raw)
        except SizeError:
            raise SelectionError(
                f"{where}: {raw!r} is not a length. Accepted: {ACCEPTED_EXPRESSION}"
            ) from None
    else:
        if not raw.isdigit():
            raise SelectionError(
                f"{where}: {raw!r} is not a repeat index (0, 1, ...). "
                f"Accepted: {ACCEPTED_EXPRESSION}"
            )
        value = int(raw)
    return Comparison(field, op, value)


@dataclass(frozen=True)
class Selection:
    """``-m`` and ``-k`` as pytest will read them once a sweep is collected, and the length
    and repeat comparisons they hold (each a marker the sweep's items carry where it holds)."""

    comparisons: tuple[Comparison, ...] = ()
    #: option dest -> the rewritten expression, only for expressions with comparisons.
    rewritten: tuple[tuple[str, str], ...] = ()


def read_selection(config) -> Selection:  # noqa: ANN001 - pytest.Config
    """Parse ``-m`` and ``-k`` without changing them; bad comparisons are refused here."""
    found: list[Comparison] = []
    rewritten: list[tuple[str, str]] = []
    for dest, option in (("markexpr", "-m"), ("keyword", "-k")):
        expression = getattr(config.option, dest, None)
        if not expression:
            continue
        translated = translate(expression, option)
        if translated.comparisons:
            rewritten.append((dest, translated.text))
        found.extend(translated.comparisons)
    return Selection(tuple(dict.fromkeys(found)), tuple(rewritten))


def register_markers(config, selection: Selection) -> None:  # noqa: ANN001 - pytest.Config
    """The comparison markers, so the items can carry them under ``--strict-markers``."""
    for comparison in selection.comparisons:
        config.addinivalue_line(
            "markers", f"{comparison.marker_name}: sweep points where {comparison} holds"
        )


def apply_selection(config, selection: Selection) -> None:  # noqa: ANN001 - pytest.Config
    """Hand pytest the rewritten ``-m``/``-k``: only in a session that collected the sweep,
    before pytest deselects by them."""
    for dest, text in selection.rewritten:
        setattr(config.option, dest, text)
