"""Workloads: arrival processes, length distributions and traces, turned into a `Requests` table."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Self

import numpy as np
from pydantic import Field, PositiveInt, model_validator

from orcasim.config import (
    MAX_REQUESTS,
    MAX_TIME_S,
    ScenarioError,
    Strict,
    check_arrival_times,
    check_rng,
)
from orcasim.requests import ClientLoop, PromptContent, Requests
from orcasim.workload.arrivals import Arrival, ConstantArrival, GammaArrival, TraceArrival
from orcasim.workload.closed_loop import ClosedLoopArrival
from orcasim.workload.lengths import (
    EmpiricalLength,
    LengthDist,
    LognormalLength,
    TokenCount,
    sample_prompt_and_output,
)
from orcasim.workload.sessions import AgentArrival, ConversationArrival, draw_plan, session_table
from orcasim.workload.traces import read_trace_with_content, times_expected, where_in_trace


class SystemPromptConfig(Strict):
    """A shared system prompt: a `fraction` of the requests start with one of `variants`
    system prompts of `tokens` tokens each (chosen uniformly), put before their own
    prompt, whose length `prompt_tokens` (or the trace) gives. What a prefix cache shares."""

    tokens: TokenCount
    fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    variants: Annotated[PositiveInt, Field(le=MAX_REQUESTS)] = 1

    def content(self, rng: np.random.Generator, own_tokens: np.ndarray) -> PromptContent:
        """Each request's segments: a system prompt (ids 0..variants-1) if it carries one,
        then its own text (ids after them); outputs get ids of their own after those."""
        check_rng(rng)
        n = len(own_tokens)
        carries = rng.random(n) < self.fraction
        variant = rng.integers(0, self.variants, size=n)
        prompts = []
        for i, (has, which, own) in enumerate(zip(carries.tolist(), variant.tolist(),
                                                    own_tokens.tolist(), strict=True)):
            system = (which, self.tokens) if has else ()
            prompts.append((*system, self.variants + i, own))
        return PromptContent(prompts, np.arange(n, dtype=np.int64) + self.variants + n)


# The length distributions of a session arrival (conversations' or agents' keys).
SESSION_LENGTH_KEYS = ("turns", "user_tokens", "steps", "observation_tokens", "output_tokens")


class WorkloadConfig(Strict):
    """The offered load. With a trace arrival the trace supplies the lengths; with a
    session arrival (conversations, agents) the sessions do, and their steps are the requests."""

    num_requests: Annotated[PositiveInt, Field(le=MAX_REQUESTS)] | None = None
    arrival: Arrival
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    max_tokens: TokenCount
    system_prompt: SystemPromptConfig | None = None

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if isinstance(self.arrival, TraceArrival):
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key) is not None:
                    raise ScenarioError(f"{key} must not be set: a trace supplies the lengths")
            cap = self.arrival.max_requests
            if self.num_requests is not None and cap is not None and cap != self.num_requests:
                raise ScenarioError(
                    f"workload.num_requests = {self.num_requests} and workload.arrival."
                    f"max_requests = {cap}: expected one of them (with a trace both cap the "
                    "requests read, the first in the file)")
            return self
        if isinstance(self.arrival, ConversationArrival | AgentArrival):
            for key in ("num_requests", "prompt_tokens", "output_tokens", "system_prompt"):
                if getattr(self, key) is not None:
                    raise ScenarioError(f"{key} must not be set: with arrival.kind = "
                                        f"{self.arrival.kind} the sessions make the requests "
                                        "(a shared system prompt is arrival.system_prompt)")
            # The sessions' own lengths warn as a request workload's do.
            for key in SESSION_LENGTH_KEYS:
                warn_if_clipped(f"arrival.{key}", getattr(self.arrival, key, None))
            return self
        missing = [k for k in ("num_requests", "prompt_tokens", "output_tokens") if getattr(self, k) is None]
        if missing:
            raise ScenarioError(f"missing {', '.join(missing)} (required unless arrival.kind is trace)")
        for key in ("prompt_tokens", "output_tokens"):
            warn_if_clipped(key, getattr(self, key))
        return self

    def draws_nothing(self) -> str | None:
        """What makes every seed's requests the same (a trace; constant arrivals or a closed
        loop's constant think times, of constant lengths; sessions of constant lengths and
        pauses at a fixed concurrency), said in a warning where replications would repeat
        one run; None where a seed draws them (a trace's system prompts chosen at random too)."""
        prompt = self.system_prompt
        if prompt is not None and prompt.fraction > 0 and (prompt.fraction < 1 or prompt.variants > 1):
            return None
        arrival = self.arrival
        if arrival.kind == "trace":
            return "workload.arrival.kind = 'trace'"
        if isinstance(arrival, ConversationArrival | AgentArrival):
            return _sessions_draw_nothing(arrival)
        if not all(d is not None and d.kind == "constant"
                   for d in (self.prompt_tokens, self.output_tokens)):
            return None
        if arrival.kind == "constant":
            return "constant arrivals of constant lengths"
        # A closed loop's constant think times drew nothing either: its replications ran
        # alike without a word (a tester's finding).
        if isinstance(arrival, ClosedLoopArrival) and arrival.think_time.kind == "constant":
            return "a closed loop of constant think times and constant lengths"
        return None


def _sessions_draw_nothing(arrival: ConversationArrival | AgentArrival) -> str | None:
    """Sessions at a fixed concurrency whose steps, lengths and pauses are constant, and
    whose system prompt is every session's or none's, draw nothing at any seed."""
    shape = arrival.shape()
    shared = shape.system_prompt.shared_fraction if shape.system_prompt is not None else 0.0
    dists = (shape.steps, shape.message_tokens, shape.output_tokens, shape.pause)
    if shape.concurrent_sessions is None or 0.0 < shared < 1.0 \
            or any(d.kind != "constant" for d in dists):
        return None
    return f"{arrival.kind} of constant lengths and pauses at a fixed concurrency"


CLIPPED_MEAN_RTOL = 0.10  # a clipped lognormal's mean this far from the one asked for: say so


def warn_if_clipped(key: str, dist: LengthDist | None) -> None:
    """A lognormal whose rounding and clipping to [1, max] move its mean far from `mean`
    runs, with a warning giving the mean it really has (mean 100, sigma 3, max 4000 has
    about 52.4). The mean after rounding: before it, mean 1.4, sigma 0.1 kept 1.40 and was
    silent, where its lengths average 1.23."""
    if not isinstance(dist, LognormalLength):
        return
    effective = dist.mean_tokens()
    if abs(effective - dist.mean) > CLIPPED_MEAN_RTOL * dist.mean:
        warnings.warn(f"workload.{key}: lognormal mean {dist.mean:g}, sigma {dist.sigma:g}, "
                      f"rounded and clipped to [1, {dist.max}], has a mean of about "
                      f"{effective:.1f} tokens",
                      UserWarning, stacklevel=2)


def generate_requests(cfg: WorkloadConfig, rng: np.random.Generator) -> Requests:
    """Draw (or read) the requests. Raises ValueError if a request exceeds `max_tokens`."""
    check_rng(rng)  # a trace reads before any draw: an int seed failed only after it
    clients, content = None, None
    if isinstance(cfg.arrival, ConversationArrival | AgentArrival):
        _read_length_files(cfg.arrival, "workload.arrival", SESSION_LENGTH_KEYS)
        sessions, concurrent = cfg.arrival.num_sessions, cfg.arrival.concurrent_sessions
        if concurrent is not None:
            _warn_above("arrival.concurrent_sessions", concurrent, "arrival.num_sessions",
                        sessions, f"at most {sessions} sessions ever run at once")
        return session_table(draw_plan(cfg.arrival.shape(), cfg.max_tokens, rng), cfg.max_tokens)
    if isinstance(cfg.arrival, TraceArrival):
        cap = cfg.arrival.max_requests or cfg.num_requests
        with _naming_missing("workload.arrival.path"):
            (arrival_s, prompt, output), content = read_trace_with_content(
                cfg.arrival.path, cfg.arrival.format, cap
            )
        if cap is not None and len(arrival_s) < cap:
            key = "arrival.max_requests" if cfg.arrival.max_requests else "num_requests"
            warnings.warn(f"workload.{key} = {cap}, but {Path(cfg.arrival.path).name} holds "
                          f"{len(arrival_s)} requests: all {len(arrival_s)} are replayed",
                          UserWarning, stacklevel=2)
        _check_trace_span(arrival_s, cfg.arrival.path, cfg.arrival.format)
        with np.errstate(over="ignore"):  # an overflow is refused next, by its key
            arrival_s = arrival_s / cfg.arrival.speedup
        check_arrival_times(arrival_s, "speedup", cfg.arrival.speedup)
    else:
        assert cfg.num_requests and cfg.prompt_tokens and cfg.output_tokens
        n = cfg.num_requests
        if isinstance(cfg.arrival, ClosedLoopArrival):  # think times in place of the gaps
            _warn_above("arrival.num_clients", cfg.arrival.num_clients, "num_requests", n,
                        f"only {n} clients ever send a request")
            clients = ClientLoop(cfg.arrival.num_clients, cfg.arrival.think_times_s(rng, n))
            arrival_s = np.full(n, np.nan)  # known only when a system runs them
        else:
            with np.errstate(over="ignore"):  # an overflow is refused next, by its key
                arrival_s = (cfg.arrival.times_s(rng, n) if isinstance(cfg.arrival, ConstantArrival)
                             else np.cumsum(cfg.arrival.gaps_s(rng, n)))
            check_arrival_times(arrival_s, "rate_per_s", cfg.arrival.rate_per_s)
            if isinstance(cfg.arrival, GammaArrival):
                _warn_unsteady_rate(cfg.arrival, n)
        _read_length_files(cfg, "workload", ("prompt_tokens", "output_tokens"))
        prompt, output = sample_prompt_and_output(cfg.prompt_tokens, cfg.output_tokens, rng, n)
    # Refused here, where the file is read, not by its format: a Mooncake file of lengths
    # alone has no hash_ids, and takes a system prompt as a CSV does.
    if cfg.system_prompt is not None and content is not None:
        raise ScenarioError("workload.system_prompt must not be set with a trace whose "
                            "hash_ids already say what the prompts share (mooncake)")
    if cfg.system_prompt is not None:
        # From a stream of its own, spawned (it takes no draw from the lengths'): drawn from
        # theirs after the outputs, a change of the output distribution's kind redrew which
        # requests carry a system prompt (half the prompts differed), against common random
        # numbers across a sweep's points.
        content = cfg.system_prompt.content(rng.spawn(1)[0], prompt)
        prompt = np.array([sum(segments[1::2]) for segments in content.prompts], dtype=np.int64)
    _check_fits(prompt + output, cfg.max_tokens, _in_file(cfg), _system_prompt_note(cfg, content))
    max_tokens = np.full(len(arrival_s), cfg.max_tokens, dtype=np.int64)
    return Requests(arrival_s.astype(np.float64), prompt, output, max_tokens, clients,
                    content=content)


# A run's span may vary by this share of its mean from seed to seed before its realised rate
# is said to be far from the one asked for (cv 10 over 1,000 requests, 0.32: realised rates
# 0.67 to 1.65 times `rate_per_s` over 20 draws of 1,000 gaps).
GAMMA_SPAN_CV_LIMIT = 0.25


def _warn_unsteady_rate(arrival: GammaArrival, n: int) -> None:
    """Gamma gaps so bursty for the run's length that its realised rate is a lottery."""
    span_cv = arrival.span_cv(n)
    if span_cv > GAMMA_SPAN_CV_LIMIT:
        enough = int(np.ceil((arrival.cv / GAMMA_SPAN_CV_LIMIT) ** 2))
        warnings.warn(
            f"workload.arrival.cv = {arrival.cv:g} over {n:,} requests: the run's span varies "
            f"by cv / sqrt(num_requests) = {span_cv:.2g} of its mean from seed to seed, so "
            f"its realised rate may be far from rate_per_s = {arrival.rate_per_s:g}; "
            f"{enough:,} requests bring that to {GAMMA_SPAN_CV_LIMIT:g}",
            UserWarning, stacklevel=3)


def _warn_above(key: str, given: int, limit_key: str, limit: int, so: str) -> None:
    """A population (closed-loop clients, concurrent sessions) above what the workload holds:
    the one the user meant never forms, so say what runs instead (`so`)."""
    if given > limit:
        warnings.warn(f"workload.{key} = {given} is above workload.{limit_key} = {limit}: {so}",
                      UserWarning, stacklevel=3)


def _read_length_files(owner: Strict, prefix: str, keys: tuple[str, ...]) -> None:
    """Read every empirical length file among `keys` of `owner` now, so that a file not
    found is named by its key (a session's was not: 'file 'nope.csv' not found' alone), and
    so is a file without the column or with a bad value in it ('e.csv: no column 'x'' named
    neither the key nor which of a workload's distributions gave it)."""
    for key in keys:
        dist = getattr(owner, key, None)
        if isinstance(dist, EmpiricalLength):
            try:
                with _naming_missing(f"{prefix}.{key}.path"):
                    dist.values()
            except ScenarioError as e:
                raise ScenarioError(f"{prefix}.{key}: {e}") from None


@contextlib.contextmanager
def _naming_missing(key: str) -> Iterator[None]:
    """A data file not found, named by the key that gives it ("file 'nope.csv' not found"
    said neither the key nor the scenario's part; a fuzzing tester's finding)."""
    try:
        yield
    except FileNotFoundError as e:
        if e.filename is not None:  # the OS's own error (a file gone mid-read): as it is
            raise
        raise FileNotFoundError(f"{key}: {e}") from None


def _check_trace_span(arrival_s: np.ndarray, path: str, fmt: str) -> None:
    """A trace whose own times pass MAX_TIME_S is in another unit (microseconds read as
    seconds): named by its file, where it was blamed on a speedup nobody set."""
    span_s = float(arrival_s.max()) if len(arrival_s) else 0.0
    if span_s > MAX_TIME_S:
        raise ScenarioError(f"workload.arrival.path = {path!r}: its arrivals span {span_s:.3g} s, "
                            f"beyond {MAX_TIME_S:g} s, where float timestamps lose precision; "
                            f"expected {times_expected(path, fmt)}")


def _in_file(cfg: WorkloadConfig) -> Callable[[int], str]:
    """Where a request sits in the workload's trace, for an error (its id is its rank by
    arrival, not its line); nothing for a drawn workload, whose ids are all there is."""
    arrival = cfg.arrival
    if not isinstance(arrival, TraceArrival):
        return lambda _request: ""
    cap = arrival.max_requests or cfg.num_requests
    return lambda request: f" ({where_in_trace(arrival.path, arrival.format, cap, request)})"


def _system_prompt_note(cfg: WorkloadConfig, content: PromptContent | None) -> Callable[[int], str]:
    """For an error about request i's prompt: the shared system prompt put before the prompt
    drawn, where it carries one (its segments: system id and tokens, then its own), since
    the lengths asked for do not show it (a tester's finding)."""
    system = cfg.system_prompt
    if system is None or content is None:
        return lambda _request: ""
    return lambda request: (f" (with workload.system_prompt's {system.tokens} tokens)"
                            if len(content.prompts[request]) > 2 else "")


def _check_fits(total_tokens: np.ndarray, max_tokens: int,
                in_file: Callable[[int], str] = lambda _request: "",
                prompt_note: Callable[[int], str] = lambda _request: "") -> None:
    over = np.flatnonzero(total_tokens > max_tokens)
    if len(over):
        i = int(over[0])
        raise ScenarioError(
            f"workload.max_tokens = {max_tokens} is below request {i}'s{in_file(i)} prompt"
            f"{prompt_note(i)} + output "
            f"= {int(total_tokens[i])} tokens ({len(over)} request(s) exceed it); "
            f"expected max_tokens >= {int(total_tokens.max())}"
        )
