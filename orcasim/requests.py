"""The request table: one numpy array per field, indexed by request id (0..n-1, arrival order)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from orcasim.workload.sessions import SessionPlan


@dataclass(frozen=True)
class ClientLoop:
    """The clients of a closed-loop workload (see `orcasim.workload.closed_loop`).

    All `num_clients` send a request at time 0; after request i finishes (or is turned
    away), its client waits `think_s[i]` and sends the next.
    """

    num_clients: int
    think_s: np.ndarray  # float64 (n,)


@dataclass(frozen=True)
class WayIn:
    """A closed loop's way in: each request reaches the engine `latency_s` after its client
    sent it (`OverheadConfig.request_latency_s`). The engine's table gets the arrival times
    at the engine; the arrival source writes the send times into `sent_s`, the clients'
    own table's `arrival_s`, from which latencies are measured."""

    latency_s: float
    sent_s: np.ndarray  # float64 (n,): NaN until each is sent


@dataclass(frozen=True)
class PromptContent:
    """What the prompts hold, for prefix caching: which requests share which prefixes.

    Request i's prompt is the content segments `prompts[i]`, a flat tuple
    (id, tokens, id, tokens, ...) whose tokens sum to its prompt length. A segment id
    names a piece of text: two prompts that begin with the same segments begin with the
    same tokens. Request i's generated tokens are the content `output_ids[i]`, so a later
    prompt can quote them (a conversation resends its history). Ids are >= 0; content
    not named here (a request without a content table) is unique to its request.
    """

    prompts: list[tuple[int, ...]]
    output_ids: np.ndarray  # int64 (n,)

    def check(self, prompt_tokens: np.ndarray) -> None:
        """Raise ValueError unless every prompt's segments add up to its length."""
        if len(self.prompts) != len(prompt_tokens) or len(self.output_ids) != len(prompt_tokens):
            raise ValueError("the content table has a different length from the requests")
        for i, segments in enumerate(self.prompts):
            if sum(segments[1::2]) != prompt_tokens[i] or min(segments, default=0) < 0:
                raise ValueError(f"request {i}'s content {segments[:6]}... does not add up "
                                 f"to its {int(prompt_tokens[i])} prompt tokens")


@dataclass(frozen=True)
class Requests:
    """Immutable description of the offered load, shared by every system in a run.

    Ids are positions in these arrays; arrivals are sorted, so id order is FCFS order.
    `max_tokens` is the per-request limit the server knows in advance (Orca reserves it).

    With `clients` set (a closed-loop workload) arrival times depend on the system, so
    `arrival_s` is NaN here; each run works on its own copy (`for_run`), whose arrival
    times its arrival source writes as the k-th arrival, in time order, gets id k.
    With `sessions` set, the whole row is written then (lengths, session, content), so
    nothing may read a row before it arrives (the arrival source writes the next one
    early, for the loop's questions about it).
    """

    arrival_s: np.ndarray  # float64 (n,)
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,)
    max_tokens: np.ndarray  # int64 (n,)
    clients: ClientLoop | None = None
    # int64 (n,): the session (conversation, agent task) each request belongs to, if known;
    # a `session` router keeps a session on one replica.
    session_ids: np.ndarray | None = None
    # What the prompts hold (shared prefixes), for prefix caching; None: all unique.
    content: PromptContent | None = None
    # A session workload's steps (`orcasim.sessions`): each run writes every row as it arrives.
    sessions: SessionPlan | None = None
    # A closed loop's table as the engine sees it, when requests reach it after they are sent.
    way_in: WayIn | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "max_tokens"):
            assert len(getattr(self, name)) == n, f"{name} has a different length"
        # NaN compares false: a closed-loop table's unknown arrivals pass.
        assert not np.any(np.diff(self.arrival_s) < 0), "arrivals must be sorted"
        if self.clients is not None:
            assert len(self.clients.think_s) == n, "think_s has a different length"

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def total_tokens(self) -> np.ndarray:
        return self.prompt_tokens + self.output_tokens

    @property
    def closed_loop(self) -> bool:
        """Whether arrivals depend on the system (clients or sessions): see `for_run`."""
        return self.clients is not None or self.sessions is not None

    def for_run(self) -> Requests:
        """The table one system's run uses: this one, or for a closed loop a copy to fill
        (for sessions, a fresh copy of every array a run writes)."""
        if not self.closed_loop:
            return self
        arrival_s = np.full(len(self), np.nan)
        if self.sessions is None:
            return dataclasses.replace(self, arrival_s=arrival_s)
        assert self.content is not None and self.session_ids is not None
        content = PromptContent(list(self.content.prompts), self.content.output_ids.copy())
        return dataclasses.replace(
            self, arrival_s=arrival_s, prompt_tokens=self.prompt_tokens.copy(),
            output_tokens=self.output_tokens.copy(), max_tokens=self.max_tokens.copy(),
            session_ids=self.session_ids.copy(), content=content)
