"""Session workloads: multi-turn conversations and agent tasks, as closed loops.

A session is a sequence of steps. Step i is one LLM call (or, for an agent that fans
out, `branches` calls issued together with the same prompt) whose prompt is the
session's whole context so far: its system prompt, every earlier message (a user turn
or a tool observation) and every earlier answer, then step i's new message. Step i+1
is sent only once step i is done (all its branches, or the first `wait_for` of them)
and the user has thought, or the tool has run, for the step's pre-drawn time. So, as in
a closed loop, arrival times are an outcome of the run; the workload fixes everything
else in advance, per session and step (`SessionPlan`), from the workload's own stream.

Context limit: when a prompt would pass `max_context_tokens`, the oldest whole turns
(a message with the answers it got) are dropped, keeping the system prompt, until it
fits (`truncation: drop_oldest`). Dropping changes the prompt's prefix after the system
prompt, as a real client's truncation does for a prefix cache.

Sessions start either at a fixed concurrency (`concurrent_sessions`: that many users or
agents each run sessions back to back, the next starting when the last ends) or by a
Poisson process (`session_rate_per_s`). Each distribution knows its theoretical mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Self

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from orcasim.config import MAX_REQUESTS, ScenarioError, Strict, check_arrival_times, check_rng
from orcasim.memory import peak_kv_tokens
from orcasim.requests import PromptContent, Requests
from orcasim.workload.closed_loop import ThinkTime
from orcasim.workload.lengths import LengthDist, TokenCount, sample_prompt_and_output


class SystemPrompt(Strict):
    """A system prompt of `tokens`; `shared_fraction` of sessions carry the same text,
    the rest one of their own of the same length."""

    tokens: TokenCount
    shared_fraction: float = 1.0

    @model_validator(mode="after")
    def _fraction(self) -> Self:
        if not 0.0 <= self.shared_fraction <= 1.0:
            raise ScenarioError(f"shared_fraction = {self.shared_fraction}: expected a number "
                                "from 0 to 1")
        return self


class FanOut(Strict):
    """Each step issues `branches` calls with the same prompt and goes on once `wait_for`
    of them are answered (or all are done, where calls turned away leave fewer answers);
    the context then grows by those first answers (ordered by branch)."""

    branches: Annotated[PositiveInt, Field(le=MAX_REQUESTS)] = 1
    wait_for: PositiveInt = 1

    @model_validator(mode="after")
    def _at_most_branches(self) -> Self:
        if self.wait_for > self.branches:
            raise ScenarioError(f"wait_for = {self.wait_for} exceeds branches = {self.branches}; "
                                "expected wait_for <= branches")
        return self


class _SessionArrival(Strict):
    """What conversations and agents share: how sessions start, and the context limit."""

    num_sessions: Annotated[PositiveInt, Field(le=MAX_REQUESTS)]
    concurrent_sessions: PositiveInt | None = None
    session_rate_per_s: PositiveFloat | None = None
    system_prompt: SystemPrompt | None = None
    output_tokens: LengthDist
    max_context_tokens: TokenCount
    truncation: Literal["drop_oldest"] = "drop_oldest"

    @model_validator(mode="after")
    def _one_start(self) -> Self:
        given = [k for k in ("concurrent_sessions", "session_rate_per_s") if getattr(self, k) is not None]
        if len(given) != 1:
            kind = getattr(self, "kind", "sessions")
            raise ScenarioError(f"workload.arrival ({kind}): {' and '.join(given) or 'neither'} "
                                "given; expected exactly one of concurrent_sessions, session_rate_per_s")
        return self

    def _shape(self, steps: LengthDist, message: LengthDist, pause: ThinkTime,
               fan_out: FanOut) -> SessionShape:
        return SessionShape(self.num_sessions, self.concurrent_sessions, self.session_rate_per_s,
                            self.system_prompt, steps, message, self.output_tokens, pause,
                            fan_out, self.max_context_tokens)


class ConversationArrival(_SessionArrival):
    """Chat sessions: `turns` user messages of `user_tokens`, each answered, with
    `think_time` between an answer and the next message."""

    kind: Literal["conversations"]
    turns: LengthDist
    user_tokens: LengthDist
    think_time: ThinkTime

    def shape(self) -> SessionShape:
        return self._shape(self.turns, self.user_tokens, self.think_time, FanOut())


class AgentArrival(_SessionArrival):
    """Agent tasks: `steps` LLM calls; each prompt adds a tool observation of
    `observation_tokens` (the first: the task) to the context, and `tool_time` passes
    between a step's answer and the next call."""

    kind: Literal["agents"]
    steps: LengthDist
    observation_tokens: LengthDist
    tool_time: ThinkTime
    fan_out: FanOut = FanOut()

    def shape(self) -> SessionShape:
        return self._shape(self.steps, self.observation_tokens, self.tool_time, self.fan_out)


SessionArrival = ConversationArrival | AgentArrival


@dataclass(frozen=True)
class SessionShape:
    """Conversations and agents in one vocabulary: a step is a message and its answers."""

    num_sessions: int
    concurrent_sessions: int | None
    session_rate_per_s: float | None
    system_prompt: SystemPrompt | None
    steps: LengthDist
    message_tokens: LengthDist
    output_tokens: LengthDist
    pause: ThinkTime  # think or tool time after a step
    fan_out: FanOut
    max_context_tokens: int

    def mean_steps(self) -> float:
        return self.steps.mean_tokens()


@dataclass(frozen=True)
class SessionPlan:
    """Every session's pre-drawn steps, and the content id of every piece of text.

    Session s's steps are the global step indices `step_start[s]` to `step_start[s + 1]`;
    step t has a message (`message_ids[t]`, `message_tokens[t]`), one answer per branch
    (`output_ids[t, b]`, `output_tokens[t, b]`) and the pause after it (`pause_s[t]`, 0
    after a session's last step). Every call is one request: n = steps * branches.
    """

    start_s: np.ndarray | None  # float64 (S,) session starts; None: `concurrent` at a time
    concurrent: int
    system_ids: np.ndarray  # int64 (S,); -1: no system prompt
    system_tokens: int
    step_start: np.ndarray  # int64 (S + 1,)
    message_ids: np.ndarray  # int64 (T,)
    message_tokens: np.ndarray  # int64 (T,)
    output_ids: np.ndarray  # int64 (T, branches)
    output_tokens: np.ndarray  # int64 (T, branches)
    pause_s: np.ndarray  # float64 (T,)
    wait_for: int
    max_context_tokens: int
    max_tokens: int  # each request's limit, prompt + output
    # The plan as a disaggregated cluster's prefill instances serve it: each call only up
    # to its first token (`peak_bound_tokens` bounds the prompt alone). The workload's
    # source still writes every row from the whole plan.
    prefill_only: bool = False

    @property
    def num_sessions(self) -> int:
        return len(self.system_ids)

    @property
    def branches(self) -> int:
        return int(self.output_tokens.shape[1])

    @property
    def num_requests(self) -> int:
        return int(self.output_tokens.size)

    def peak_bound_tokens(self) -> np.ndarray:
        """Per step, an upper bound on a call's prompt + output - 1 (its peak KV): the
        context as if every step kept its longest answers, capped at the limit (a prefill
        instance's output is one token: `prefill_only`)."""
        bounds = []
        for s in range(self.num_sessions):
            steps = slice(int(self.step_start[s]), int(self.step_start[s + 1]))
            top = np.sort(self.output_tokens[steps], axis=1)[:, self.branches - self.wait_for:]
            grown = np.cumsum(self.message_tokens[steps] + top.sum(axis=1)) - top.sum(axis=1)
            prompt = np.minimum(self.system_tokens * (self.system_ids[s] >= 0) + grown,
                                self.max_context_tokens)
            output = 1 if self.prefill_only else self.output_tokens[steps].max(axis=1)
            bounds.append(peak_kv_tokens(prompt, output))
        return np.concatenate(bounds) if bounds else np.zeros(0, dtype=np.int64)


def draw_plan(shape: SessionShape, max_tokens: int, rng: np.random.Generator) -> SessionPlan:
    """Draw every session's steps. Raises ScenarioError if a step could not fit its limits."""
    check_rng(rng)
    num, branches = shape.num_sessions, shape.fan_out.branches
    _check_calls(num * shape.mean_steps() * branches, "would make about")  # before drawing any of them
    steps = shape.steps.sample(rng, num)
    step_start = np.concatenate([[0], np.cumsum(steps)]).astype(np.int64)
    total = int(step_start[-1])
    _check_calls(total * branches, "make")
    message_tokens, answers = sample_prompt_and_output(shape.message_tokens, shape.output_tokens,
                                                       rng, total, branches)
    output_tokens = answers.reshape(total, branches)
    pause_s = shape.pause.sample(rng, total)
    pause_s[step_start[1:] - 1] = 0.0  # nothing follows a session's last step
    system_ids, system_tokens, next_id = _system_prompts(shape.system_prompt, num, rng)
    message_ids = next_id + np.arange(total, dtype=np.int64)
    output_ids = next_id + total + np.arange(total * branches, dtype=np.int64).reshape(total, branches)
    start_s = None
    if shape.session_rate_per_s is not None:
        with np.errstate(over="ignore"):  # an overflow is refused next, by its key
            start_s = np.cumsum(rng.exponential(1.0 / shape.session_rate_per_s, size=num))
        check_arrival_times(start_s, "session_rate_per_s", shape.session_rate_per_s)
    plan = SessionPlan(start_s, shape.concurrent_sessions or num, system_ids, system_tokens,
                       step_start, message_ids, message_tokens, output_ids, output_tokens,
                       pause_s, shape.fan_out.wait_for, shape.max_context_tokens, max_tokens)
    _check_limits(plan)
    return plan


def _check_calls(calls: float, verb: str) -> None:
    """Every call is a request: the sessions may not make more than MAX_REQUESTS."""
    if calls > MAX_REQUESTS:
        raise ScenarioError(
            f"workload.arrival: the sessions {verb} {calls:,.0f} calls (num_sessions x steps x "
            f"fan_out.branches); expected at most {MAX_REQUESTS:,}")


def _system_prompts(cfg: SystemPrompt | None, num: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """Each session's system prompt id (-1: none), its length, and the next free id.
    Id 0 is the shared text; a session without it gets one of its own."""
    if cfg is None:
        return np.full(num, -1, dtype=np.int64), 0, 0
    shared = rng.random(num) < cfg.shared_fraction
    ids = np.where(shared, 0, 1 + np.arange(num, dtype=np.int64))
    return ids.astype(np.int64), cfg.tokens, num + 1


def _check_limits(plan: SessionPlan) -> None:
    """Every step's prompt must be able to fit the context limit, and every call `max_tokens`."""
    longest_message = int(plan.message_tokens.max()) if len(plan.message_tokens) else 0
    need = plan.system_tokens + longest_message
    if need > plan.max_context_tokens:
        raise ScenarioError(
            f"workload.arrival.max_context_tokens = {plan.max_context_tokens} is below the "
            f"system prompt plus the longest message = {need} tokens, which truncation cannot "
            f"drop; expected max_context_tokens >= {need}")
    longest_output = int(plan.output_tokens.max()) if plan.output_tokens.size else 0
    need = plan.max_context_tokens + longest_output
    if need > plan.max_tokens:
        raise ScenarioError(
            f"workload.max_tokens = {plan.max_tokens} is below max_context_tokens plus the "
            f"longest output = {need} tokens; expected max_tokens >= {need}")


def session_table(plan: SessionPlan, max_tokens: int) -> Requests:
    """The workload's table: one row per call, to be filled by each run (`Requests.for_run`).

    Rows are placeholders (one-token prompts and outputs) until a run writes them.
    """
    n = plan.num_requests
    ones = np.ones(n, dtype=np.int64)
    content = PromptContent([(-1, 1)] * n, np.full(n, -1, dtype=np.int64))
    return Requests(np.full(n, np.nan), ones, ones.copy(), np.full(n, max_tokens, dtype=np.int64),
                    session_ids=np.full(n, -1, dtype=np.int64), content=content, sessions=plan)
