"""Shared pieces of validated configuration: the strict base model and error formatting.

Every scenario object derives from :class:`Strict`: frozen, and an unknown key is an
error that names the key and the nearest valid one, because a typo must never be
silently ignored.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import math
import re
import types
import typing
from collections.abc import Iterator, Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


def is_number(value: object) -> bool:
    """An argument given from Python as a real number: an int, a float or a numpy scalar, not
    a bool (which Python counts as an int) nor a numeral in a string. The one test that the
    API's refusals of a wrong type share (plots, SLO bounds, a sweep's bound and workers)."""
    return not isinstance(value, bool) and isinstance(value, Real)


def is_whole_number(value: object) -> bool:
    """`is_number`, and a whole one (an int or a numpy integer)."""
    return not isinstance(value, bool) and isinstance(value, Integral)


def check_rng(rng: object, what: str = "rng") -> None:
    """Refuse anything but a `numpy.random.Generator` where a sampler draws from one: an int
    seed raised "'int' object has no attribute 'integers'" from inside, and a legacy
    RandomState drew from another stream, or failed at the first draw it lacks."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{what} = {rng!r:.80} ({type(rng).__name__}): expected a numpy "
                        "Generator, e.g. np.random.default_rng(seed)")


class ScenarioError(ValueError):
    """A user-facing configuration error: one line, naming the key, the value and the expectation."""


@contextlib.contextmanager
def errors_under(prefix: str, *, opening: tuple[str, ...] = ("",), drop: str = "") -> Iterator[None]:
    """A block's refusal, built without knowing where the block sits, names its whole key: a
    ScenarioError raised inside whose text opens with one of `opening` is raised again with
    `drop` taken off its front and `prefix` put there ('scheduler.x = 0: ...' under
    'systems[2].'; 'cost: file ... not found' as 'cost.mlp_csv: file ... not found')."""
    try:
        yield
    except ScenarioError as e:
        text = str(e)
        if text.startswith(opening):
            raise ScenarioError(prefix + text.removeprefix(drop)) from None
        raise


# The `naming_under` blocks in force, outermost first: each a prefix and the openings it names.
_WARNINGS_UNDER: contextvars.ContextVar[tuple[tuple[str, tuple[str, ...]], ...]] = \
    contextvars.ContextVar("_WARNINGS_UNDER", default=())


@contextlib.contextmanager
def naming_under(prefix: str, opening: tuple[str, ...], *, errors: bool = True) -> Iterator[None]:
    """`errors_under` (unless `errors` is false), and a warning shown meanwhile
    (`warning_text`) that opens with one of `opening` is named the same way: 'scheduler.
    chunk_size_tokens = 2 is below ...' said of one system among several did not say which
    (a tester's finding). Blocks nest as errors_under's do, the innermost naming first."""
    token = _WARNINGS_UNDER.set((*_WARNINGS_UNDER.get(), (prefix, opening)))
    try:
        if errors:
            with errors_under(prefix, opening=opening):
                yield
        else:
            yield
    finally:
        _WARNINGS_UNDER.reset(token)


def warning_text(message: Warning | str) -> str:
    """A warning's text as the user reads it, named by the `naming_under` blocks in force."""
    text = str(message)
    for prefix, opening in reversed(_WARNINGS_UNDER.get()):
        if text.startswith(opening):
            text = prefix + text
    return text


# Bounds every part of the scenario shares. MAX_REQUESTS: a bound, not a crash in numpy's
# allocator: a run keeps about 0.8 KB a request (peak RSS 774 MB at 1M paged requests, the
# README's benchmark), so 1e8 is some 80 GB already. MAX_TIME_S: past it a float64 timestamp
# keeps less than 0.12 us (np.spacing(1e9)): a run this long is almost surely a unit mistake
# (a rate in req/hour, a cost in ms), and TTFT and TPOT, the differences of such timestamps,
# would lose their precision silently.
MAX_REQUESTS = 100_000_000
MAX_TIME_S = 1e9


class Strict(BaseModel):
    """Frozen pydantic model that rejects unknown keys with a 'did you mean' hint."""

    # Infinite or NaN numbers are refused at load time: they ran to NaN or infinite metrics.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Keys that belong in another block, with a hint: the nearest valid key is no help there
    # ('router' in a fleet's group suggested 'count'; a tester's note).
    MISPLACED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        valid = set(cls.model_fields)
        for key, value in data.items():
            if key not in valid and key in cls.MISPLACED:
                raise ScenarioError(f"unknown key '{key}' here: {cls.MISPLACED[key]}")
            if key not in valid:
                raise ScenarioError(f"unknown key '{key}'{_other_kinds(cls, key)}"
                                    f"{_suggestion(str(key), valid)}")
            if isinstance(value, bool) and _reads_bool_as_number(cls.model_fields[key].annotation):
                # pydantic reads true as 1: a boolean where a number is expected is a mistake.
                # Elsewhere (a block, a list, a name) pydantic's own message says what is
                # expected: this one said "a number or string" of `workload: true`.
                raise ScenarioError(f"{key} = {str(value).lower()}: expected a number, not a "
                                    "boolean")
            text_at = _text_for_number(cls.model_fields[key].annotation, value)
            if text_at is not None:
                # pydantic parsed text as a number here ('2' ran as 2) while a model config
                # refused it and a sweep grid's '2' made a column of text: refused everywhere.
                at, text = text_at
                raise ScenarioError(f"{key}{at} = {text!r}: expected {number_of(key)}, not "
                                    "text (unquote it)")
            if value is not None and not isinstance(value, bool) \
                    and _is_switch(cls.model_fields[key].annotation):
                # pydantic reads 1, 0, 'yes', 'on' and '1' as booleans: `padding: 1` ran
                # padded, `pad_prompts: 0` unpadded, without a word.
                raise ScenarioError(f"{key} = {value!r}: expected true or false")
        return data


def refuse_booleans(value: Any) -> Any:
    """`value`, a data file's number, list of numbers or mapping of them, refusing a boolean
    anywhere in it: pydantic reads true as 1 (a fitted cost's `const: true` priced every
    iteration 1 s more, without a word; a tester's finding)."""
    named = value.items() if isinstance(value, dict) else [(None, value)]
    for key, item in named:
        if any(isinstance(x, bool) for x in (item if isinstance(item, list | tuple) else [item])):
            shown = f"{key} = {str(item).lower()}: " if key is not None else ""
            raise ValueError(f"{shown}expected a number, not a boolean")
    return value


def _reads_bool_as_number(annotation: Any) -> bool:
    """Whether a field's type takes a number (anywhere in its unions and annotations), which
    pydantic would read a boolean as, and no boolean."""
    return not _admits(annotation, (bool,)) and _admits(annotation, (int, float))


def _text_for_number(annotation: Any, value: Any) -> tuple[str, str] | None:
    """(where, text) of a number written as text ('2') where a field takes no text: the
    value itself (where '') or an item of a list of numbers ('[1]'); None if there is none.
    Other text is pydantic's to refuse, which says what the field takes."""
    if isinstance(value, str) and _is_number(value):
        takes = _admits(annotation, (int, float)) and not _takes_text(annotation, value)
        return ("", value) if takes else None
    items = _list_item_type(annotation)
    if isinstance(value, list) and items is not None:
        for i, item in enumerate(value):
            if _text_for_number(items, item) is not None:
                return f"[{i}]", item
    return None


def _takes_text(annotation: Any, value: str) -> bool:
    """Whether a field's type takes `value`, a text, as itself: a name, a path, one of a
    literal's words, a block's name (resolved by a validator); a number's type does not."""
    origin = typing.get_origin(annotation)
    if annotation in (int, float, bool, type(None)) or origin in (list, dict, tuple, set):
        return False
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is typing.Annotated:
        inner, *metadata = typing.get_args(annotation)
        return _takes_text(inner, value) or any(callable(getattr(m, "func", None)) for m in metadata)
    if origin in (typing.Union, types.UnionType):
        return any(_takes_text(a, value) for a in typing.get_args(annotation))
    return True


def _list_item_type(annotation: Any) -> Any:
    """The item type of a field that is a list or tuple of one type (optional or annotated)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple) and args and (len(args) == 1 or args[1:] == (Ellipsis,)):
        return args[0]
    if origin is typing.Annotated:
        return _list_item_type(args[0])
    if origin in (typing.Union, types.UnionType):
        forms = [a for a in args if a is not type(None)]
        return _list_item_type(forms[0]) if len(forms) == 1 else None
    return None


def _is_number(text: str) -> bool:
    """Whether `text` reads as a finite number (an infinite one is refused as such)."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _is_switch(annotation: Any) -> bool:
    """Whether a field's type is a boolean alone (or an optional one)."""
    if annotation is bool:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_switch(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        forms = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(forms) and all(_is_switch(a) for a in forms)
    return False


def _admits(annotation: Any, types: tuple[type, ...]) -> bool:
    """Whether a field's type admits one of `types` (or anything) in its unions and annotations."""
    if annotation is Any or annotation in types:
        return True
    if typing.get_origin(annotation) in (list, dict, tuple, typing.Literal):
        return False  # the types inside a container or a literal's values are not the field's
    return any(_admits(arg, types) for arg in typing.get_args(annotation))


def _other_kinds(cls: type[Strict], key: object) -> str:
    """' for kind 'poisson' (a key of kind 'gamma')' where `key` belongs to the other forms
    of a tagged union `cls` is a form of: `cv` under a Poisson arrival said only 'valid keys
    are: kind, rate_per_s', as if no arrival took it (a tester's note)."""
    kinds = [_kind_of(form) for form in _kind_siblings(cls) if key in form.model_fields]
    if not kinds or "kind" not in cls.model_fields:
        return ""
    return (f" for kind {_kind_of(cls)!r} (a key of kind "
            f"{', '.join(repr(k) for k in dict.fromkeys(kinds))})")


def _kind_of(form: type[BaseModel]) -> str:
    return str(typing.get_args(form.model_fields["kind"].annotation)[0])


def _kind_siblings(cls: type[Strict]) -> list[type[Strict]]:
    """The other forms of every tagged union (by `kind`) that `cls` is a form of, found in
    the fields of every block: the unions themselves are plain annotations."""
    found: list[type[Strict]] = []
    blocks: list[type[Strict]] = [Strict]
    while blocks:
        block = blocks.pop()
        blocks += block.__subclasses__()
        for field in block.model_fields.values():
            for forms in _tagged_unions(field.annotation):
                if cls in forms:
                    found += [f for f in forms if f is not cls and f not in found]
    return found


def _tagged_unions(annotation: Any) -> Iterator[tuple[type[Strict], ...]]:
    """The unions of blocks with a `kind` inside a field's type (its Annotated, Optional...)."""
    args = typing.get_args(annotation)
    forms = tuple(a for a in args if isinstance(a, type) and issubclass(a, Strict)
                  and "kind" in a.model_fields)
    if len(forms) > 1:
        yield forms
    for arg in args:
        yield from _tagged_unions(arg)


def _suggestion(key: str, valid: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.5)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; valid keys are: {', '.join(sorted(valid))}"


def format_validation_error(err: ValidationError, source: str, data: Any = None) -> str:
    """Turn a pydantic error into one line per problem: `source: dotted.key: value: expectation`.

    A value that fits none of a union's forms (`replicas: 4` or a list of groups) gets one
    error per form from pydantic; they read as one problem (see `_union_problems`)."""
    lines = []
    for loc, value, msg in _union_problems(err.errors(include_url=False), data):
        shown = _shown(value, msg)
        lines.append(f"{source}: {loc}{shown}: {msg}" if shown else f"{source}: {_joined(loc, msg)}")
    return "; ".join(lines)


def _shown(value: Any, msg: str) -> str:
    """` = value` for an error's line: null and booleans as YAML writes them, a list cut
    to 60 characters; nothing for a mapping, or for a missing key (pydantic's input is then
    the mapping around it)."""
    if isinstance(value, dict) or msg.startswith("Field required"):
        return ""
    if value is None:
        return " = null"
    if isinstance(value, bool):  # as YAML writes it (and the boolean check above says it)
        return f" = {str(value).lower()}"
    if isinstance(value, list):
        text = repr(value)
        return f" = {text if len(text) <= 60 else text[:57] + '...'}"
    return f" = {value!r}"


def format_field_error(err: ValidationError, source: str, data: Any = None) -> str:
    """`format_validation_error`, less the source where every problem is at the top level:
    there a validator's own message names its field (a model built from command-line flags
    or a model config: 'expert_parallel = 3: ...'), and the source would only repeat it."""
    message = format_validation_error(err, source, data)
    if all(not problem["loc"] for problem in err.errors()):
        return message.removeprefix(f"{source}: ")
    return message


# A message that opens with a key: `workload.num_requests = 0: ...`, `systems[2].name = ...`.
_OPENS_WITH_KEY = re.compile(r"^[a-z_]+(?:\[\d+\])*(?:[.\[]| = | \()")


def _joined(loc: str, msg: str) -> str:
    """`loc: msg`, unless a validator's message already names its key from part of `loc` on
    ('workload.num_requests = 0' raised under 'workload', 'scheduler.x' under
    'systems[2].scheduler'): then that key, with the part of `loc` before it in front; or
    names one inside the block (`targets[0] = ...` under `slo`): then `loc.key`."""
    if loc == "(top level)":
        return msg if _OPENS_WITH_KEY.match(msg) else f"{loc}: {msg}"
    parts = loc.split(".")
    for k in range(len(parts)):
        tail = ".".join(parts[k:])
        if msg.startswith(tail) and msg[len(tail):len(tail) + 1] in (".", "[", " "):
            return ".".join([*parts[:k], msg]) if k else msg
    # A message that names the block under an outer key (`model.moe.x` raised under `moe`,
    # where `orcasim model` validates the model alone): its own key already says it all.
    key = msg.split(" ", 1)[0]
    if _OPENS_WITH_KEY.match(msg) and f".{loc}." in f".{key}":
        return msg
    # A key relative to the block that raised it: `targets[0] = ...` under `slo`.
    return f"{loc}.{msg}" if _OPENS_WITH_KEY.match(msg) else f"{loc}: {msg}"


# pydantic's error types for a value where a block of keys belongs ('Input should be a valid
# dictionary or instance of ClusterConfig', '... or object to extract fields from').
MAPPING_EXPECTED = ("model_type", "model_attributes_type", "dict_type")


# pydantic's error types for a value that is no number where one belongs.
NUMBER_EXPECTED = ("float_parsing", "int_parsing", "float_type", "int_type")

# How a number's expected unit follows pydantic's message: `...; expected a number of seconds`.
UNIT_TEXT = "; expected "

# The units a key's name ends with, as a value's expectation says them (STYLE: units in names).
_UNITS = (("_per_s", "a number per second"), ("_s", "a number of seconds"),
          ("_tokens", "a number of tokens"), ("_bytes", "a number of bytes"))


def number_of(key: str) -> str:
    """What a number key expects, its unit read from its name: 'a number of seconds' for
    `warmup_s`, 'a number' where the name carries none."""
    key = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])  # a list's item: its key's unit
    return next((said for suffix, said in _UNITS if key.endswith(suffix)), "a number")


# The largest integer pydantic converts a float to (a 64-bit one's).
_INT64_MAX = 2**63 - 1


def _too_large_for_an_integer(loc: str, value: Any) -> str:
    """What an integer key expects of a value pydantic cannot convert: 'kv_capacity_tokens =
    1e+20: Unable to parse input string as an integer, exceeded maximum size' said neither,
    and 100000000000000000000 written out passes where 1e20, a float, does not."""
    whole = number_of(loc).replace("a number", "a whole number", 1)
    if isinstance(value, float):
        return (f"Input should be an integer, and a number written with an exponent or a "
                f"decimal point converts to one only within ±{_INT64_MAX:.3g}; expected {whole} "
                "within that")
    return f"Input should be an integer of fewer digits; expected {whole}"


def _union_problems(errors: list[Any], data: Any) -> list[tuple[str, Any, str]]:
    """(dotted key, value, message) per problem. pydantic reports a value that fits none of
    a union's forms once per form; a form the value is not even the type of (an int where
    a list was allowed) is dropped when another form says what is wrong inside it, and when
    none does they merge into one: 'Input should be a valid integer or a valid list'."""
    problems: list[tuple[str, Any, str]] = []
    unions: dict[str, dict[str, list[tuple[str, Any, str]]]] = {}
    for e in errors:
        loc, union, form = _dotted(e["loc"], data)
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if isinstance(e.get("input"), bool) and e["type"] == "string_type":
            # `name: on` or `path: no`, unquoted: YAML 1.1 made it a boolean.
            msg += " (YAML reads yes, no, on, off, true and false unquoted as booleans: quote the text)"
        if e["type"] in NUMBER_EXPECTED and number_of(loc) != "a number":
            # 'warmup_s = '10ms': Input should be a valid number' did not say in what unit.
            msg += f"{UNIT_TEXT}{number_of(loc)}"
        if e["type"] == "int_parsing_size":
            msg = _too_large_for_an_integer(loc, e.get("input"))
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc, value, msg = _kind_problem(loc, e)
            # Inside a union's form (a group's scheduler in `replicas: [...]`) it says what
            # is wrong in that form, so the form the value is not (an int) goes unsaid.
            if union is None:
                problems.append((loc, value, msg))
            else:
                unions.setdefault(union, {}).setdefault(form, []).append((loc, value, msg))
            continue
        if e["type"] in MAPPING_EXPECTED:  # pydantic's words name an internal class
            msg = ("Input should be a mapping of keys (key: value)" if loc == union  # one of its forms
                   else "expected a mapping of its keys (key: value), not a single value")
        if union is None:
            problems.append((loc, e.get("input"), msg))
            continue
        wrong_type = loc == union and e["type"].endswith(("_type", "_parsing"))
        unions.setdefault(union, {}).setdefault("" if wrong_type else form, []).append(
            (loc, e.get("input"), msg))
    for union, forms in unions.items():
        fitting = [p for form, found in forms.items() if form for p in found]
        if fitting:
            problems += fitting
            continue
        messages = [m for _, _, m in forms[""]]
        # The unit a number form adds ('; expected a number per second'), said once at the
        # end: kept in each form, a grid's [null] read 'Input should be a valid integer;
        # expected a number per second or a valid number; expected a number per second or ...'.
        unit = next((m[m.index(UNIT_TEXT):] for m in messages if UNIT_TEXT in m), "")
        expected = dict.fromkeys(m.removeprefix("Input should be ").split(UNIT_TEXT)[0].split(",")[0]
                                 for m in messages)
        problems.append((union or "(top level)", forms[""][0][1],
                         f"Input should be {' or '.join(expected)}{unit}"))
    # Two forms may say the same thing (a NaN is no finite int nor finite float): once. By key
    # and message, not value: a NaN is not equal to itself.
    return list({(loc, msg): (loc, value, msg) for loc, value, msg in problems}.values())


def _kind_problem(loc: str, error: Any) -> tuple[str, Any, str]:
    """A block's `kind` that names no form, or is missing, by its key: pydantic said "Input
    tag 'poison' found using 'kind' does not match any of the expected tags" of the block,
    and "Unable to extract tag using discriminator 'kind'" where it was left out."""
    key = "kind" if loc == "(top level)" else f"{loc}.kind"
    if error["type"] == "union_tag_not_found":
        return key, None, "Field required (it says which kind of block this is)"
    tag, expected = error["ctx"]["tag"], error["ctx"]["expected_tags"]
    given = error["input"].get("kind", tag) if isinstance(error["input"], dict) else tag
    close = difflib.get_close_matches(str(tag), [t.strip("' ") for t in expected.split(",")], n=1)
    return key, given, f"expected one of {expected}" + (f"; did you mean '{close[0]}'?" if close else "")


def _dotted(loc: tuple[Any, ...], data: Any) -> tuple[str, str | None, str]:
    """The dotted key of an error location, where a union chose among its forms (None if
    nowhere) and the form: pydantic puts the form's label in the location ('constrained-int',
    'list[ReplicaGroup]', 'ReplicaGroup'), which is no key of the data."""
    out, node, union, form = "", data, None, ""
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            continue  # pydantic inserts the tag of a tagged union into the location
        if isinstance(part, int):
            out += f"[{part}]"
        elif "function-" in part:
            continue  # pydantic's internal names for validators
        elif _is_form_label(part) and not (isinstance(node, dict) and part in node):
            if union is None:
                union, form = out, part
            continue
        else:
            out += ("." if out else "") + part
        node = _child(node, part)
    return out or "(top level)", union, form


def _is_form_label(part: str) -> bool:
    """A union form's label: a type ('int', 'constrained-int', 'list[...]') or a model's class
    name; keys here are snake_case."""
    return "[" in part or "-" in part or part[:1].isupper() or part in ("int", "float", "str", "bool")


def _child(node: Any, part: Any) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


def first_repeat(values: Sequence[object]) -> int | None:
    """The index of the first value equal to an earlier one (1 equals 1.0, not True: a mix
    of kinds is refused as such); None if none is: a sweep's point listed twice runs twice
    under the same seeds (`orcasim.sweeps`)."""
    for i, value in enumerate(values):
        if any(v == value and isinstance(v, bool) == isinstance(value, bool) for v in values[:i]):
            return i
    return None


def past_the_clock(last_s: float) -> str:
    """Why a run that reaches `last_s` (beyond MAX_TIME_S, or overflowed to inf) is refused."""
    if not math.isfinite(last_s):  # a step, a transfer or a wait too long for a float
        return ("the run's clock overflows to infinity (a step or a KV transfer takes longer "
                "than a float can hold); expected rates, costs, bandwidths and think times in "
                "seconds and bytes (is one off by a unit?)")
    return (f"the run reaches t = {last_s:.3g} s, beyond {MAX_TIME_S:g} s, where float timestamps "
            f"keep only {np.spacing(min(last_s, 1e300)):.2g} s of precision; expected rates, "
            "costs and think times in seconds (is one off by a unit?)")


def check_arrival_times(times_s: np.ndarray, key: str, value: float) -> None:
    """A rate (or a trace's speedup) so small that the arrival times overflow to infinity, or
    pass MAX_TIME_S: refused by its key, `workload.arrival.<key>`, before any system runs (the
    run's own check of its times comes after the engine; `validate` and a sweep's check of
    its points before it run no engine)."""
    if not np.isfinite(times_s).all():
        raise ScenarioError(f"workload.arrival.{key} = {value:g}: the arrival times overflow to "
                            f"infinity; expected a {key} that keeps them below {MAX_TIME_S:g} s")
    if len(times_s) and float(times_s.max()) > MAX_TIME_S:
        # A session rate counts sessions started, not requests (each makes several calls).
        starts = "sessions" if key == "session_rate_per_s" else "requests"
        expected = (f"a speedup that keeps them below {MAX_TIME_S:g} s" if key == "speedup"
                    else f"a rate in {starts} per second (is it off by a unit?)")
        raise ScenarioError(f"workload.arrival.{key} = {value:g}: the arrival times reach "
                            f"{float(times_s.max()):.3g} s, beyond {MAX_TIME_S:g} s, where float "
                            f"timestamps lose precision; expected {expected}")


def kind_form(root: type[BaseModel], parts: Sequence[str | int], kind: object) -> type[Strict] | None:
    """The form of kind `kind` of the tagged union at the dotted path `parts` (a
    `parse_dotted` list, less its `kind`) below `root`; None where the path reaches no such
    union (or no form of that kind)."""
    annotations: list[Any] = [root]
    for part in parts:
        inner = [a for ann in annotations for a in _inner_types(ann)]
        if isinstance(part, int):
            annotations = [item for a in inner if (item := _list_item_type(a)) is not None]
        else:
            annotations = [c.model_fields[part].annotation for c in inner
                           if isinstance(c, type) and issubclass(c, BaseModel) and part in c.model_fields]
    for annotation in annotations:
        for forms in _tagged_unions(annotation):
            found = [f for f in forms if _kind_of(f) == kind]
            if found:
                return found[0]
    return None


def _inner_types(annotation: Any) -> list[Any]:
    """A type with its Optional, Union and Annotated wrappers taken off, as a list of forms."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _inner_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(annotation) for t in _inner_types(a)]
    return [annotation]
