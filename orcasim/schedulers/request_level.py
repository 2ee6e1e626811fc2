"""Request-level batching: the FasterTransformer / Triton baseline of the Orca paper.

When no batch is running, it forms one of up to `max_batch_size` queued requests, FCFS
(each reserving `max_tokens` of KV, as a static batch allocates for the longest
sequence; with `padding`, the batch's members times its longest prompt plus its longest
output must fit as well, the positions a padded batch holds). The batch runs its prefill, then decode iterations until its longest member
finishes; nobody joins or leaves in between, and every member's tokens reach the user
when the batch ends. With `padding` (the default, as in FasterTransformer) every member
is costed as if it had the batch's longest prompt and ran to the batch's longest output.
`max_queue_delay_s` waits for a fuller batch, like Triton's dynamic batcher.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveInt

from orcasim.config import MAX_TIME_S, Strict
from orcasim.cost.base import Batch
from orcasim.requests import Requests
from orcasim.schedulers.base import (
    NO_RESULT,
    DecodeRun,
    FastForward,
    Scheduler,
    SchedulerOutput,
    StepResult,
    empty_output,
)


class RequestLevelConfig(Strict):
    kind: Literal["request_level"]
    max_batch_size: PositiveInt
    # Past the clock's range a wait is a unit mistake: refused here by its key, where the
    # run's overflow could not say which (a fuzzing tester's finding).
    max_queue_delay_s: Annotated[NonNegativeFloat, Field(le=MAX_TIME_S)] = 0.0
    padding: bool = True


class RequestLevelScheduler(Scheduler):
    fast_forward = FastForward(
        assumes=("schedule", "update_from_output", "_form_batch", "_costed_lengths", "_plan"),
        reason="a static batch admits nobody until it ends, and between the steps at which a "
               "costed member drops out every step is the same pure decode",
    )

    def __init__(self, cfg: RequestLevelConfig, requests: Requests, kv_capacity_tokens: int,
                 kv_groups: int = 1):
        super().__init__(requests, kv_capacity_tokens, kv_groups)
        self.cfg = cfg
        self.members = np.zeros(0, dtype=np.int64)  # the running static batch
        self.step = 0  # iterations the batch has completed
        self.reserved_tokens = 0

    def schedule(self, now_s: float) -> SchedulerOutput:
        if len(self.members) == 0:
            wake_at_s = self._form_batch(now_s)
            if len(self.members) == 0:
                return empty_output(0, wake_at_s)
        return self._plan()

    def _form_batch(self, now_s: float) -> float | None:
        head = self._peek_waiting()
        if head is None:
            return None
        deadline_s = float(self.requests.arrival_s[head]) + self.cfg.max_queue_delay_s
        if self.num_waiting < self.cfg.max_batch_size and now_s < deadline_s:
            return deadline_s  # Triton-style: wait for a fuller batch until the deadline
        members: list[int] = []
        longest_prompt = longest_output = 0
        while len(members) < self.cfg.max_batch_size and self.num_waiting:
            head = self._peek_waiting()
            assert head is not None
            need = int(self.requests.max_tokens[head])
            if self.reserved_tokens + need > self.kv_capacity_tokens:
                break
            if self.cfg.padding:
                # A padded batch holds every member at the longest prompt plus the longest
                # output (FasterTransformer allocates batch x that many positions): it must
                # fit too. Each member's max_tokens bounds its own length, not the padded
                # one (prompts 10 and 500, outputs 500 and 10, max_tokens 510 each: 2 x 1,000
                # positions, which read past a 1,020-token cache; a reviewer's finding).
                prompt = max(longest_prompt, int(self.requests.prompt_tokens[head]))
                output = max(longest_output, int(self.requests.output_tokens[head]))
                if members and (len(members) + 1) * (prompt + output) > self.kv_capacity_tokens:
                    break
                longest_prompt, longest_output = prompt, output
            members.append(self._pop_waiting())
            self.reserved_tokens += need
        self.members = np.array(members, dtype=np.int64)
        self.step = 0
        return None

    def _costed_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output lengths of the members as the cost model sees them."""
        ids = self.members
        prompt = self.requests.prompt_tokens[ids]
        output = self.requests.output_tokens[ids]
        if self.cfg.padding:
            prompt = np.full_like(prompt, prompt.max())
            output = np.full_like(output, output.max())
        return prompt, output

    def _plan(self) -> SchedulerOutput:
        ids = self.members
        prompt, output = self._costed_lengths()
        active = self.step < output  # unpadded members drop out of the cost when done
        if self.step == 0:
            query, context = prompt, prompt
        else:
            query, context = np.ones_like(prompt), prompt + self.step
        batch = Batch(query[active], context[active])
        real_new = np.where(self.step == 0, self.requests.prompt_tokens[ids], 1)
        progressing = self.step < self.requests.output_tokens[ids]
        real_new = np.where(progressing, real_new, 0)
        return SchedulerOutput(ids, real_new, batch, self.reserved_tokens)

    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        ids = self.members
        outputs = self.requests.output_tokens[ids]
        progressing = self.step < outputs
        self.computed[ids] += out.num_new_tokens
        self.generated[ids] += progressing
        self.step += 1
        if self.step < outputs.max():
            return StepResult()
        # The batch ends: every member's tokens reach the user now.
        assert np.array_equal(self.generated[ids], outputs)
        self.members = np.zeros(0, dtype=np.int64)
        self.reserved_tokens = 0
        return StepResult(ids, ids)

    def has_unfinished(self) -> bool:
        return len(self.members) > 0 or self.num_waiting > 0

    def active_ids(self) -> list[int]:
        # A static batch holds every member's slot and KV until the batch ends.
        return self.members.tolist()

    @property
    def num_requests(self) -> int:
        return len(self.members) + self.num_waiting

    def kv_in_use_tokens(self) -> int:
        return self.reserved_tokens

    # Fast-forward hooks (see Scheduler). A static batch admits nobody, and between two
    # steps at which a costed member drops out every step is the same pure decode.

    def decode_run(self, plan: SchedulerOutput) -> DecodeRun | None:
        prompt, output = self._costed_lengths()
        first = self.step + 1  # the run's first step
        later = output[output > first]
        if len(later) == 0:
            return None  # the batch ends with this plan
        active = first < output
        return DecodeRun(int(later.min()) - first, prompt[active] + first)

    def admits_arrival(self, req_id: int) -> bool:
        return len(self.members) == 0

    def advance(
        self, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
    ) -> tuple[StepResult, StepResult]:
        if num_iterations == 1:
            return self.update_from_output(plan), NO_RESULT
        ids = self.members
        outputs = self.requests.output_tokens[ids]
        end = self.step + num_iterations
        # Real tokens over steps [step, end): the plan's own, then one per step still owed.
        self.computed[ids] += plan.num_new_tokens + np.clip(
            np.minimum(outputs, end) - (self.step + 1), 0, None
        )
        self.generated[ids] += np.clip(np.minimum(outputs, end) - self.step, 0, None)
        self.step = end
        if end < outputs.max():
            return NO_RESULT, NO_RESULT
        assert end == outputs.max() and np.array_equal(self.generated[ids], outputs)
        self.members = np.zeros(0, dtype=np.int64)
        self.reserved_tokens = 0
        return NO_RESULT, StepResult(ids, ids)
