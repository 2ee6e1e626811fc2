"""The engine's own time per iteration, beside the GPU's: `cost: {kind: ..., overhead: {...}}`.

A real engine spends time outside its kernels: it schedules, prepares inputs, samples,
detokenises and streams results (host work the GPU waits for), and it launches every
kernel from the host, which the GPU cannot outrun. For a batch of B requests with P
prompt (or chunk) tokens, on a deployment of L layers:

    time = max(gpu_s, L * launch_per_layer_s)                   launch-bound or GPU-bound
         + per_iteration_s + [tensor_parallel * data_parallel > 1] * tensor_parallel_per_iteration_s
         + per_sequence_s * B + per_prefill_token_s * P          host work, not overlapped

With data-parallel attention (a MoE deployment's `data_parallel_attention` groups) each
group's engine process schedules and samples its own requests, side by side, and the
multi-process term applies as it does to tensor parallelism. A request runs on the one group
that holds its KV and the step ends when the slowest group's host does, so B and P are a
group's 1/DP share or, where more, the largest request's own: 1 sequence and its prompt
tokens (`host_s`; the roofline's `data_parallel_floor_s` bounds the GPU part the same way).
Pipeline stages alone do not count (TP 1 x PP 2 pays none): the term is what Vidur measured
at TP 2 and 4 beyond TP 1, and Vidur keys those overheads by the TP degree alone, so its
pipelines read their TP degree's row; an engine whose stages pay a round trip of their own
can add it to `per_iteration_s`.

`gpu_s` is the cost kind's own time (roofline, profile, fitted or linear). The host
launches kernels asynchronously, so an iteration lasts at least as long as launching
them all (a small model at a small batch, or a wide tensor-parallel group whose GPU time
has shrunk, is launch-bound: "CPU overhead" in PyTorch's and gpt-fast's words); the rest
of the host's work happens before or after the forward pass and adds to it. Under pipeline
parallelism a batch passes the stages in turn, each stage's host launching its own layers
once the batch reaches it (vLLM's workers receive a stage's input before they run it): each
stage's GPU part is floored by its own layers' launches, and one batch's is the floored stages'
sum (`staged_gpu_s`, `stage_times_s`): max(gpu_s, L * launch_per_layer_s) where the stages split
by layers alone, more where the model's ends (the LM head on the last stage) lift one stage
above its floor while the others sit on theirs. The host's work is no stage's: an engine
schedules and prepares each batch once, one batch after another, so a pipeline that keeps
several batches in flight (Orca's) runs it before the batch's first stage, overlapping the
stages' work on other batches (`pipeline_host_s`), and one batch at a time adds it once. P
counts the queries of more than one token: a one-token prompt or chunk is priced as a decode
(a `Batch` does not say which it is).

Defaults (`overhead: {}`) come from Vidur's measurements of a vLLM-style engine on A100
(microsoft/vidur, `data/profiling/a100/cpu_overheads.csv` as of commit 6d98aa8, removed in
bee57da; sarathi-serve's vLLM scheduler; MIT), the
sum of the medians of schedule, sampler, prepare_inputs and process_model_outputs:
0.81 ms + 0.042 ms per request at TP 1 (Llama-2-7B, phi-2; batch 8-128), and 0.7-1.2 ms
more plus Ray's driver-to-worker round trip (ray_comm_time, 6.2-6.5 ms) at TP 2 and 4.
Launches default to 0 (an engine that replays CUDA graphs, as vLLM does from v0.2.5 for
decodes); an eager engine's value is fitted to whole-iteration measurements (see
`scenarios/validation/`). `request_latency_s` is not iteration time: each request reaches
the engine that much after the client sent it (HTTP, tokenisation), so a client measures it
in TTFT and E2E; 0 by default. Without an `overhead` block a cost kind has none (an ideal
engine, measured at the engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import NonNegativeFloat, model_validator

from orcasim.config import ScenarioError, Strict
from orcasim.cost.base import (
    Batch,
    CostModel,
    DecodeLine,
    OutsideSteps,
    StageEnds,
    check_durations,
    counted_decode_steps_s,
    runnable_steps,
    split_stages,
)

VIDUR_PER_ITERATION_S = 0.81e-3  # TP 1: schedule + sampler + prepare inputs + process outputs
VIDUR_PER_SEQUENCE_S = 0.042e-3  # the same medians' slope in the batch size (8 to 128)
VIDUR_TENSOR_PARALLEL_S = 7.0e-3  # TP 2 and 4: ~0.9 ms more host work + 6.2-6.5 ms Ray round trip
MOVED_KEYS = {"iteration_overhead_s": "overhead.per_iteration_s"}


class OverheadConfig(Strict):
    """The engine's time outside the GPU's kernels (see the module docstring)."""

    per_iteration_s: NonNegativeFloat = VIDUR_PER_ITERATION_S
    per_sequence_s: NonNegativeFloat = VIDUR_PER_SEQUENCE_S
    per_prefill_token_s: NonNegativeFloat = 0.0
    tensor_parallel_per_iteration_s: NonNegativeFloat = VIDUR_TENSOR_PARALLEL_S
    launch_per_layer_s: NonNegativeFloat = 0.0
    # A request's time outside the engine's loop (the client's connection, the API
    # server's parsing and tokenisation): it reaches the engine this much after it was
    # sent, so its TTFT and E2E include it. 0: measured at the engine.
    request_latency_s: NonNegativeFloat = 0.0


class CostConfigBase(Strict):
    """What every cost kind accepts: the engine's overhead on top of its own time."""

    overhead: OverheadConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_KEYS.items():
                if old in data:
                    raise ScenarioError(f"'{old}' has moved: write it as cost.{new}")
        return data


class OverheadCost(CostModel):
    """`inner`'s GPU time, floored by the host's kernel launches, plus the host's own work."""

    def __init__(
        self, inner: CostModel, cfg: OverheadConfig, num_layers: int | None,
        tensor_parallel: int, data_parallel: int = 1, checked_source: str | None = None,
        stage_layers: Sequence[int] = (),
    ) -> None:
        if cfg.launch_per_layer_s and num_layers is None:
            raise ScenarioError(
                "cost.overhead.launch_per_layer_s needs the layer count: give the scenario "
                "keys 'model' and 'hardware'"
            )
        self.inner = inner
        # The GPU part the engine runs is the floored one: a fit pricing under a nanosecond
        # that a launch floor lifts is fine, so a model read from a file (`checked_source`)
        # is checked here, on max(gpu, floor), by whoever built `inner` unchecked. Host work
        # does not lift it: a negative GPU time is wrong whatever is added to it.
        self.checked_source = checked_source
        self.launch_per_layer_s = cfg.launch_per_layer_s
        self.floor_s = (num_layers or 0) * cfg.launch_per_layer_s
        # Pipeline stages, each floored by its own launches, where the model places parts on
        # one stage (`stage_ends`): one batch passes them in turn, so its GPU time is the sum
        # of the floored stages (`staged_gpu_s`), as the pipelined engine's stages add up.
        self.stages = tuple(stage_layers) if len(stage_layers) > 1 and cfg.launch_per_layer_s else ()
        # The processes of one stage (a pipeline's stages do not count: see the docstring).
        processes = tensor_parallel * data_parallel
        tp_s = cfg.tensor_parallel_per_iteration_s if processes > 1 else 0.0
        self.fixed_s = cfg.per_iteration_s + tp_s
        # Each data-parallel attention group does its share of the per-request and
        # per-prompt-token work, but no less than its largest request's (`host_s`; a fit of
        # those terms reads the slowest group's features, `host_units`).
        self.data_parallel = data_parallel
        self.per_sequence_s = cfg.per_sequence_s / data_parallel
        self.per_prefill_token_s = cfg.per_prefill_token_s / data_parallel
        self.own_sequence_s = cfg.per_sequence_s  # one request's own group: all of its work
        self.own_prefill_token_s = cfg.per_prefill_token_s

    def host_s(self, batch_size: int, prefill_tokens: int, largest_prefill_tokens: int = 0) -> float:
        """The host's work that the GPU waits for (one order of operations: the same bits).
        Under data-parallel attention, the slowest group's: at least the balanced share and
        at least the work of the group running the request with the most prompt tokens
        (`largest_prefill_tokens`, 0 where none is a prefill), that request's alone; every
        group pays the per-iteration terms."""
        balanced_s = self._balanced_host_s(batch_size, prefill_tokens)
        if self.data_parallel == 1:
            return balanced_s
        return max(balanced_s, self._own_host_s(largest_prefill_tokens))

    def _balanced_host_s(self, batch_size: int, prefill_tokens: int) -> float:
        """A group's host work with the sequences and prompt tokens spread evenly."""
        return (self.fixed_s + self.per_sequence_s * batch_size
                + self.per_prefill_token_s * prefill_tokens)

    def _own_host_s(self, largest_prefill_tokens: int) -> float:
        """The host work of the group that runs the largest request, counting that request alone."""
        return self.fixed_s + self.own_sequence_s + self.own_prefill_token_s * largest_prefill_tokens

    def host_units(self, batch_size: int, prefill_tokens: int,
                   largest_prefill_tokens: int = 0) -> tuple[float, float]:
        """The sequences and prompt tokens of the group whose host work `host_s` prices: what
        a unit of `per_sequence_s` and of `per_prefill_token_s` costs (a fit's features)."""
        dp = self.data_parallel
        if dp > 1 and (self._own_host_s(largest_prefill_tokens)
                       > self._balanced_host_s(batch_size, prefill_tokens)):
            return 1.0, float(largest_prefill_tokens)
        return batch_size / dp, prefill_tokens / dp

    def staged_gpu_s(self, gpu_s: float, ends: StageEnds) -> float:
        """`gpu_s` over the stages (`split_stages`), each floored by its own launches, added
        up: the stage times' GPU parts (`stage_times_s`), in the same order (same bits).
        Where the LM head lifts only the last stage above its floor, that sum exceeds
        max(gpu_s, every layer's launches): Orca's pipeline and a one-batch engine read the
        same request 3% apart (a tester's find, Llama-3-8B over 4 stages)."""
        return sum(max(g, k * self.launch_per_layer_s)
                   for g, k in zip(split_stages(gpu_s, self.stages, ends), self.stages, strict=True))

    def _floored_s(self, gpu_s: float, batch: Batch) -> float:
        ends = self.inner.stage_ends(batch) if self.stages else None
        return max(gpu_s, self.floor_s) if ends is None else self.staged_gpu_s(gpu_s, ends)

    def gpu_part_s(self, batch: Batch) -> float:
        """The GPU's part of a (non-empty) batch's iteration: its time, floored by the
        launches; checked where the model came from a file."""
        gpu_s = self._floored_s(self.inner.iteration_time_s(batch), batch)
        if self.checked_source is not None:
            check_durations(gpu_s, self.checked_source, f"a batch of {batch.size} requests")
        return gpu_s

    def iteration_time_s(self, batch: Batch) -> float:
        if batch.size == 0:
            return 0.0
        return self.gpu_part_s(batch) + self.batch_host_s(batch)

    def batch_host_s(self, batch: Batch) -> float:
        """`host_s` of a batch: its prompts (or chunks) are its queries of more than one token."""
        return self._prompts_host_s(batch.size, batch.query_tokens[batch.query_tokens > 1].tolist())

    def _prompts_host_s(self, batch_size: int, prompt_tokens: list[int]) -> float:
        """`host_s` of `batch_size` requests, with `prompt_tokens` the prompts' (or chunks')
        query tokens: the largest of them counts only under data-parallel attention."""
        largest = max(prompt_tokens, default=0) if self.data_parallel > 1 else 0
        return self.host_s(batch_size, sum(prompt_tokens), largest)

    def iteration_time_lists_s(
        self, query_tokens: list[int], context_tokens: list[int], query_total: int,
        context_total: int,
    ) -> float:
        if not query_tokens:
            return 0.0
        if self.stages:  # the stages' ends need the batch
            return super().iteration_time_lists_s(query_tokens, context_tokens, query_total,
                                                  context_total)
        gpu_s = max(self.inner.iteration_time_lists_s(query_tokens, context_tokens, query_total,
                                                      context_total), self.floor_s)
        if self.checked_source is not None:
            check_durations(gpu_s, self.checked_source, f"a batch of {len(query_tokens)} requests")
        return gpu_s + self._prompts_host_s(len(query_tokens), [q for q in query_tokens if q > 1])

    def stage_ends(self, batch: Batch) -> StageEnds | None:
        """The model's own (the host's work is no stage's: `pipeline_host_s`)."""
        return self.inner.stage_ends(batch)

    def stage_times_s(self, batch: Batch, layers: Sequence[int]) -> list[float]:
        """Each stage's share of the GPU time (the model's split: its ends where they run),
        floored by launching its own layers: every stage's host launches all of its kernels
        (split by layers, the floor shrank with the stages: 0.125 s a stage where launching
        20 layers at 10 ms takes 0.2). The engine's host work is no stage's: it schedules
        and prepares each batch once, before its first stage (`pipeline_host_s`)."""
        if batch.size == 0:
            return [0.0] * len(layers)
        gpus_s = self.inner.stage_times_s(batch, layers)
        if self.launch_per_layer_s:
            gpus_s = [max(g, k * self.launch_per_layer_s) for g, k in zip(gpus_s, layers, strict=True)]
        if self.checked_source is not None:
            check_durations(np.array(gpus_s), self.checked_source, f"a batch of {batch.size} requests")
        return gpus_s

    def pipeline_host_s(self, batch: Batch) -> float:
        """`host_s` of a batch, once: a pipelined engine's host schedules, prepares and
        samples each batch once, one after another, while the stages run others. vLLM v0
        (vllm/engine/async_llm_engine.py, `run_engine_loop`: an `engine_step` task a
        virtual engine, each scheduling its batch with `scheduler[virtual_engine].schedule()`
        and processing its outputs on the one event loop) and v1 (vllm/v1/engine/core.py,
        `EngineCore.step_with_batch_queue`: the one engine-core thread schedules a batch,
        submits it with `non_block=True` and schedules the next while the queue has room,
        then `update_from_output` for the oldest). Split by layers over the stages, as
        orcasim charged it, a 4-stage pipeline ran its host's work 4 batches at a time."""
        return self.batch_host_s(batch) if batch.size else 0.0

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        return counted_decode_steps_s(self, context_tokens, num_steps)

    def decode_steps_outside(
        self, context_tokens: np.ndarray, num_steps: int
    ) -> tuple[np.ndarray, OutsideSteps | None]:
        gpu_s, outside = self.inner.decode_steps_outside(context_tokens, num_steps)
        if len(context_tokens) == 0:
            return gpu_s, outside
        if not self.stages:
            gpu_s = np.maximum(gpu_s, self.floor_s)
        else:  # `_floored_s`, step by step
            gpu_s = np.array([max(g, self.floor_s) if ends is None else self.staged_gpu_s(g, ends)
                              for g, ends in zip(gpu_s.tolist(), self._decode_ends(context_tokens, len(gpu_s)),
                                                 strict=True)])
        gpu_s = runnable_steps(gpu_s, self.checked_source)
        return gpu_s + self.host_s(len(context_tokens), 0), outside

    def _decode_ends(self, context_tokens: np.ndarray, num_steps: int) -> list[StageEnds | None]:
        """The model's stage ends at each of `num_steps` decode steps, contexts growing by one.
        With one attention group they depend on the batch's size alone: the same at every
        step. Under data-parallel attention the group that sets the time (the balanced share,
        or the longest context's own group) can change as the contexts grow, and with it the
        ends' tokens: priced once, a run whose stages straddle their floor finished 4.2-4.9e-7 s
        before reference mode's (Qwen3-30B-A3B at TP 2 x DP 2 x PP 2, prompts of 2,130,
        1,000 and 1,000 tokens, 60 steps, under Orca's, vLLM's and Sarathi's fast loops)."""
        ones = np.ones_like(context_tokens)
        if self.data_parallel == 1:
            return [self.inner.stage_ends(Batch(ones, context_tokens))] * num_steps
        return [self.inner.stage_ends(Batch(ones, context_tokens + k)) for k in range(num_steps)]

    def count_outside(self, outside: OutsideSteps, num_steps: int) -> None:
        self.inner.count_outside(outside, num_steps)

    def decode_line(self, size: int, context_total: int) -> DecodeLine | None:
        line = self.inner.decode_line(size, context_total)
        if line is None or line.floor_s or line.plus_s or self.stages:
            return None  # one floor and one addition on top of a plain line, no more
        return line._replace(floor_s=self.floor_s, plus_s=self.host_s(size, 0))

    def out_of_range_count(self) -> int:
        return self.inner.out_of_range_count()
