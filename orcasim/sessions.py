"""The arrival source of a session workload: each step's completion makes the next step.

The workload (`orcasim.workload.sessions.SessionPlan`) fixes every session's steps in
advance; this source decides, as the run goes, when each is sent and what its prompt
holds. A step is sent as `branches` calls with the same prompt. Once `wait_for` of them
are answered, or all are done where calls turned away as too large leave too few answers
(calls reported done together count in branch order; a cluster reports each
replica's at its own event, lower-numbered replicas first at one time), the session's context
grows by the step's message and those calls' answers (in branch order; a call turned away
as too large adds no answer), and the next step is sent
`pause_s` later (think or tool time); calls still running then are left to finish, and
their answers are not used. A turned-away call is done without an answer: the session goes
on, as an agent goes on after a failed call, rather than stopping with its steps unsent; a
fan-out waits for answers, not for failures.
A session's last step ends it; with a fixed concurrency the next session starts then.

Ids: the k-th call to arrive, in time order (ties: session, then branch), gets id k, and
its row of the run's own table (`Requests.for_run`) is written then: prompt and output
lengths, `max_tokens`, session and prompt content. The loop may ask about the next
arrival before it is taken (`Scheduler.admits_arrival`, `never_fits`): the rows of the
pending sends it can see (the next one, and those `times_until` returns) are written
ahead, and rewritten if an earlier send is pushed before them.

Fast mode stays exact as for `orcasim.closed_loop`: completions become visible at a
jump's last boundary, and what they send is sent at or after it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import numpy as np

from orcasim.requests import Requests
from orcasim.sources import ArrivalSource

Segments = tuple[int, ...]  # flat (id, tokens, id, tokens, ...), as in PromptContent


class SessionSource(ArrivalSource):
    """Calls made as sessions progress; writes each one's row into the run's own table.

    After the run, `step_sent_s[t]` and `step_done_s[t]` say when global step t was sent
    and when its required calls were done, `step_answered[t]` whether any of those calls
    was answered (not all turned away); `call_step` and `call_branch` map each request id
    to its step and branch.
    """

    closed_loop = True

    def __init__(self, requests: Requests) -> None:
        plan = requests.sessions
        assert plan is not None, "a session source needs the workload's sessions"
        assert requests.content is not None and requests.session_ids is not None
        self.plan, self.requests, self.content = plan, requests, requests.content
        self.arrival_s = requests.arrival_s  # this run's times: NaN until each arrives
        way_in = requests.way_in  # requests reach the engine later than they are sent
        self._sent_s = None if way_in is None else way_in.sent_s
        self._latency_s = 0.0 if way_in is None else way_in.latency_s
        self.session_ids = requests.session_ids
        self._num_requests = plan.num_requests
        self._sends: list[tuple[float, int, int]] = []  # heap of (send_s, session, branch)
        num_steps = len(plan.message_tokens)
        self.step_sent_s = np.full(num_steps, np.nan)
        self.step_done_s = np.full(num_steps, np.nan)
        self.step_answered = np.zeros(num_steps, dtype=bool)
        self.call_step = np.full(self._num_requests, -1, dtype=np.int64)
        self.call_branch = np.full(self._num_requests, -1, dtype=np.int64)
        self._step = [-1] * plan.num_sessions  # each session's step in progress; -1: none
        self._turns: list[list[Segments]] = [[] for _ in range(plan.num_sessions)]
        self._prompt: list[tuple[Segments, int]] = [((), 0)] * plan.num_sessions
        self._done: list[list[tuple[int, bool]]] = [[] for _ in range(plan.num_sessions)]
        self.next_index = 0
        self._next_session = 0
        # Called with a row's id once it is written (or rewritten): a view of the table
        # (a disaggregated cluster's prefill side) keeps its own columns in step.
        self.row_written: list[Callable[[int], None]] = []
        self._start_sessions()

    def _start_sessions(self) -> None:
        plan = self.plan
        if plan.start_s is None:
            for _ in range(min(plan.concurrent, plan.num_sessions)):
                self._start_next(0.0)
        else:
            for s, start_s in enumerate(plan.start_s.tolist()):
                self._send_step(s, int(plan.step_start[s]), start_s)
        self._write_ahead()

    def _start_next(self, time_s: float) -> None:
        s = self._next_session
        if s < self.plan.num_sessions:
            self._next_session += 1
            self._send_step(s, int(self.plan.step_start[s]), time_s)

    # The loop's side (see ArrivalSource).

    def pending(self) -> bool:
        return self.next_index < self._num_requests and bool(self._sends)

    def next_time_s(self) -> float:
        return self._sends[0][0] + self._latency_s

    def take_until(self, now_s: float) -> range:
        """Ids for the calls at the engine by `now_s`, in time order; their rows are written
        (and their send times, where they reach the engine later: `Requests.way_in`)."""
        sends, i, latency_s, sent_s = self._sends, self.next_index, self._latency_s, self._sent_s
        while i < self._num_requests and sends and sends[0][0] + latency_s <= now_s:
            send_s, s, b = heapq.heappop(sends)
            self._write_row(i, s, b)
            self.arrival_s[i] = send_s + latency_s  # exact for a latency of 0
            if sent_s is not None:
                sent_s[i] = send_s
            i += 1
        taken = range(self.next_index, i)
        self.next_index = i
        self._write_ahead()
        return taken

    def times_until(self, time_s: float) -> np.ndarray:
        latency_s = self._latency_s
        due = sorted(e for e in self._sends if e[0] + latency_s <= time_s)
        due = due[: self._num_requests - self.next_index]
        for k, (_, s, b) in enumerate(due):  # rows the loop may ask about before they arrive
            self._write_row(self.next_index + k, s, b)
        return np.array([e[0] + latency_s for e in due], dtype=np.float64)

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        """Calls done at `time_s`: a step whose required calls are all done moves on."""
        self._record(req_ids, time_s, answered=True)

    def on_rejected(self, req_ids: Iterable[int], time_s: float) -> None:
        """Calls turned away at `time_s`: done, without an answer for the context."""
        self._record(req_ids, time_s, answered=False)

    # The sessions' side.

    def _record(self, req_ids: Iterable[int], time_s: float, answered: bool) -> None:
        # In id order (a step's branches are consecutive ids, in branch order): which of
        # several answers at one time a step keeps must not depend on how a stepper
        # lists its completions (the fused Orca loop lists them backwards).
        for req_id in sorted(req_ids):
            s, t = int(self.session_ids[req_id]), int(self.call_step[req_id])
            if self._step[s] != t:
                continue  # a straggler of a step that has moved on: its answer is unused
            done = self._done[s]
            done.append((int(self.call_branch[req_id]), answered))
            # Done with `wait_for` answers, or with its last call where turned-away ones
            # leave too few: a turned-away call (at its arrival, before any answer) ended
            # a step of two of four candidates with one (a tester's finding).
            if sum(a for _, a in done) == self.plan.wait_for or len(done) == self.plan.branches:
                self._step_done(s, t, time_s)
        self._write_ahead()

    def _step_done(self, s: int, t: int, time_s: float) -> None:
        """Step t of session s is done at `time_s`: grow the context, send the next step."""
        plan = self.plan
        self.step_done_s[t] = time_s
        self.step_answered[t] = any(answered for _, answered in self._done[s])
        turn = [int(plan.message_ids[t]), int(plan.message_tokens[t])]
        for b, answered in sorted(self._done[s]):
            if answered:
                turn += [int(plan.output_ids[t, b]), int(plan.output_tokens[t, b])]
        self._turns[s].append(tuple(turn))
        self._done[s] = []
        if t + 1 < int(plan.step_start[s + 1]):
            self._send_step(s, t + 1, time_s + float(plan.pause_s[t]))
            return
        self._step[s] = -1
        self._turns[s] = []
        if plan.start_s is None:
            self._start_next(time_s)

    def _send_step(self, s: int, t: int, send_s: float) -> None:
        """Make step t's prompt (truncated to the limit) and queue its calls at `send_s`."""
        self._step[s] = t
        self.step_sent_s[t] = send_s
        self._prompt[s] = self._prompt_of(s, t)
        for b in range(self.plan.branches):
            heapq.heappush(self._sends, (send_s, s, b))

    def _prompt_of(self, s: int, t: int) -> tuple[Segments, int]:
        """Session s's context plus step t's message, oldest turns dropped to fit the limit."""
        plan, turns = self.plan, self._turns[s]
        system: Segments = ()
        if plan.system_ids[s] >= 0:
            system = (int(plan.system_ids[s]), plan.system_tokens)
        message = (int(plan.message_ids[t]), int(plan.message_tokens[t]))
        fixed = plan.system_tokens * bool(system) + message[1]
        sizes = [sum(turn[1::2]) for turn in turns]
        total = fixed + sum(sizes)
        drop = 0
        while total > plan.max_context_tokens:  # drop_oldest; the workload checked `fixed` fits
            total -= sizes[drop]
            drop += 1
        del turns[:drop]
        segments = system + tuple(x for turn in turns for x in turn) + message
        return segments, total

    def _write_row(self, i: int, s: int, b: int) -> None:
        plan, requests = self.plan, self.requests
        t = self._step[s]
        segments, prompt_tokens = self._prompt[s]
        requests.prompt_tokens[i] = prompt_tokens
        requests.output_tokens[i] = plan.output_tokens[t, b]
        requests.max_tokens[i] = plan.max_tokens
        self.session_ids[i] = s
        self.content.prompts[i] = segments
        self.content.output_ids[i] = plan.output_ids[t, b]
        self.call_step[i], self.call_branch[i] = t, b
        for written in self.row_written:
            written(i)

    def _write_ahead(self) -> None:
        """The next send's row, for the loop's questions about the next arrival."""
        if self._sends and self.next_index < self._num_requests:
            _, s, b = self._sends[0]
            self._write_row(self.next_index, s, b)


