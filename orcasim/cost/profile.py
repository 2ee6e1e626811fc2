"""The `profile` cost model: iteration time interpolated from measured operator tables.

Sources (Vidur's formats, microsoft/vidur, MIT; times in ms):
- `mlp_csv`: per-layer token-batched operators against `num_tokens`, per TP degree.
- `attention_csv`: decode attention against batch size x KV length (Vidur, like us, keys a
  decode batch by its mean KV length); prefill attention against chunk size x cached KV.
  Or `aiconfigurator_dir`: aiconfigurator's generation/context attention parquet tables
  (ai-dynamo/aiconfigurator, Apache-2.0). Without either, attention comes from `roofline`.
- `all_reduce_csv` / `send_recv_csv`: collectives against message bytes. Without them, the
  ring model of `orcasim.cost.parallel`.
The LM head is not in Vidur's tables and comes from the roofline.

Every lookup outside a table's measured range extrapolates linearly, warns once per table
and counts the iteration in `out_of_range_count()`: it never extrapolates silently.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import PurePath
from typing import Literal

import numpy as np
from pydantic import model_validator

from orcasim.config import ScenarioError, errors_under
from orcasim.cost.base import (
    Batch,
    CostModel,
    OutsideSteps,
    StageEnds,
    check_durations,
    counted_decode_steps_s,
    runnable_steps,
)
from orcasim.cost.catalog import Deployment, ModelSpec, known_names
from orcasim.cost.flops import lm_head_op
from orcasim.cost.interp import SlicedTable2D, Table1D
from orcasim.cost.overhead import CostConfigBase
from orcasim.cost.parallel import stage_boundaries_cross_nodes
from orcasim.cost.profile_tables import (
    aiconfigurator_attention,
    mlp_table,
    network_table,
    vidur_attention,
)
from orcasim.cost.roofline import Roofline, RooflineCostConfig
from orcasim.paths import DataPath, OptionalDataPath


class ProfileCostConfig(CostConfigBase):
    kind: Literal["profile"]
    mlp_csv: DataPath
    attention_csv: OptionalDataPath = None
    aiconfigurator_dir: OptionalDataPath = None
    all_reduce_csv: OptionalDataPath = None
    send_recv_csv: OptionalDataPath = None
    # Used for what the tables do not cover (LM head; attention or collectives if absent).
    roofline: RooflineCostConfig = RooflineCostConfig(kind="roofline")

    @model_validator(mode="after")
    def _one_attention_source(self) -> ProfileCostConfig:
        if self.attention_csv and self.aiconfigurator_dir:
            raise ScenarioError("give attention_csv or aiconfigurator_dir, not both")
        if self.roofline.overhead is not None:  # it was ignored: only the whole cost's applies
            raise ScenarioError("roofline.overhead is not used here (the roofline only fills in "
                                "what the tables do not time): expected the engine's overhead "
                                "as cost.overhead")
        return self


TABLE_KEYS = ("mlp_csv", "attention_csv", "aiconfigurator_dir", "all_reduce_csv", "send_recv_csv")


def gpu_family(name: str) -> str:
    """'a100-80gb' -> 'a100'; 'a100_sxm' and 'a100_dgx' (the vendored tables' folders) too."""
    return re.split(r"[-_]", name.lower(), maxsplit=1)[0]


def _warn_if_measured_elsewhere(cfg: ProfileCostConfig, gpu: str) -> None:
    """A table times the GPU it was measured on, whatever the scenario's hardware says: Vidur's
    A100 tables priced an H100 deployment as an A100 without a word (a left-alone note). The
    GPU is read from a folder of the table's path named for a catalog GPU's family (Vidur's
    compute/a100/, network/a100_dgx/; aiconfigurator's a100_sxm/); a custom GPU is not checked."""
    families = {gpu_family(name) for name in known_names("gpus")}
    if gpu_family(gpu) not in families:
        return
    for key in TABLE_KEYS:
        path = getattr(cfg, key)
        folders = [part for part in PurePath(str(path)).parts if gpu_family(part) in families] \
            if path else []
        if folders and gpu_family(folders[-1]) != gpu_family(gpu):
            measured = gpu_family(folders[-1])
            warnings.warn(f"cost.{key} = {str(path)!r}: measured on an {measured} (its folder "
                          f"{folders[-1]}), but the deployment runs on {gpu}; its times are the "
                          f"{measured}'s", UserWarning, stacklevel=2)


def _check_profiled_shape(model: ModelSpec) -> None:
    """The vendored tables time dense bf16/fp16 layers with multi-head or grouped attention."""
    unprofiled = [what for what, present in (
        ("mixture-of-experts layers (model.moe)", model.moe is not None),
        ("latent attention (model.mla)", model.mla is not None),
        ("sliding-window attention (model.sliding_window)", model.sliding_window is not None),
        (f"{model.weight_dtype} weights", model.weight_dtype not in (None, "bf16", "fp16")),
        # An fp32 model (dtype_bytes 4) was priced from bf16 tables with fp32 weights, KV and
        # attention around them (a tester's finding), where weight_dtype fp32 was refused.
        (f"{model.dtype_bytes}-byte activations (model.dtype_bytes)", model.dtype_bytes != 2),
        (f"an {model.kv_cache_dtype} KV cache", model.kv_cache_dtype not in (None, "bf16", "fp16")),
    ) if present]
    if unprofiled:
        raise ScenarioError(f"cost.kind = 'profile': model {model.name} has {', '.join(unprofiled)}, "
                            "which its tables do not time; expected cost.kind roofline")


class ProfileCost(CostModel):
    """Iteration time = layers x (token ops + attention + 2 all-reduces) + sends + ends."""

    def __init__(self, cfg: ProfileCostConfig, deployment: Deployment) -> None:
        self.cfg = cfg
        self.model, hw = deployment.model, deployment.hardware
        _check_profiled_shape(self.model)
        _warn_if_measured_elsewhere(cfg, hw.gpu.name)
        self.tp, self.pipeline_stages = hw.tensor_parallel, hw.pipeline_parallel
        self.roofline = Roofline(cfg.roofline, deployment)
        with _naming("mlp_csv"):
            self.token_ops, self.embedding = mlp_table(cfg.mlp_csv, self.model, self.tp)
        with _naming("attention_csv" if cfg.attention_csv else "aiconfigurator_dir"):
            self.decode_attention, self.prefill_attention = _attention_tables(cfg, self.model, self.tp)
        with _naming("all_reduce_csv"):
            self.all_reduce = network_table(cfg.all_reduce_csv, "all_reduce", self.tp, hw) if cfg.all_reduce_csv else None
        # Each stage boundary's send from the table's rows for its placement (two workers in
        # a node, or one a node across): the boundaries by placement, counted.
        self.send_recv: list[tuple[Table1D, int]] | None = None
        self.boundary_sends: list[Table1D] = []
        if cfg.send_recv_csv:
            crossings = stage_boundaries_cross_nodes(hw)
            with _naming("send_recv_csv"):
                tables = {crosses: network_table(cfg.send_recv_csv, "send_recv", 2, hw, crosses)
                          for crosses in dict.fromkeys(crossings)}
            self.send_recv = [(table, crossings.count(crosses)) for crosses, table in tables.items()]
            self.boundary_sends = [tables[crosses] for crosses in crossings]
        self.activation_bytes_per_token = self.model.hidden_size * self.model.dtype_bytes
        self._out_of_range = 0
        self._warned: set[str] = set()
        # Extrapolated along a noisy edge segment, a table can price a batch past its range
        # below zero (Vidur's Llama-2-70B TP 2 decode attention: 1,024 decodes at 4,096 KV
        # tokens, -10 ms an iteration, ran time backwards): checked as a fit's prices are.
        self.checked_source: str | None = (
            f"cost.kind = 'profile' ({PurePath(str(cfg.mlp_csv)).name} and its tables, "
            "extrapolated past their measured range)")
        # While a decode run is priced ahead: each table's out-of-range points, kept (not
        # warned of) until the steps that ran are known (`count_outside`).
        self._deferred: dict[str, list[np.ndarray]] | None = None

    def out_of_range_count(self) -> int:
        return self._out_of_range

    def _look(
        self, name: str, table: Table1D | SlicedTable2D, *query: np.ndarray, relevant: np.ndarray | bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Look up `query`; flag (and warn once per table about) relevant points out of range."""
        values, outside = table(*query)
        outside = outside & relevant
        if self._deferred is not None:
            self._deferred.setdefault(name, []).append(np.asarray(outside))
        elif outside.any():
            self._warn(name)
        return values, outside

    def _warn(self, name: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(
                f"profile cost: {name} queried outside its measured range; extrapolating "
                f"linearly and counting such iterations in cost_out_of_range",
                stacklevel=4,
            )

    def _token_side(self, num_tokens: np.ndarray, batch_size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Everything but attention, for arrays of token and request counts: (seconds, outside)."""
        layers = self.model.num_layers
        ops, out = self._look("mlp.csv num_tokens", self.token_ops, num_tokens)
        emb, _ = self.embedding(num_tokens)
        comm, comm_out = self._communication(num_tokens)
        lm_head = self.roofline.op_time_s(lm_head_op(self.model, self.tp), batch_size)
        total = layers * ops + emb + comm + lm_head
        return total, out | comm_out

    def stage_ends(self, batch: Batch) -> StageEnds | None:
        """`_token_side`'s embedding and LM head, and `_communication`'s send at each stage
        boundary (see `StageEnds`); their out-of-range points are counted there, once."""
        if self.pipeline_stages == 1 or batch.size == 0:
            return None
        num_tokens = np.asarray(float(batch.total_query_tokens))
        emb, _ = self.embedding(num_tokens)
        lm_head = self.roofline.op_time_s(lm_head_op(self.model, self.tp), float(batch.size))
        if self.send_recv is None:
            sends_s = self.roofline.stage_sends_s(float(num_tokens))
        else:
            size = num_tokens * self.activation_bytes_per_token
            sends_s = tuple(float(table(size)[0]) for table in self.boundary_sends)
        return StageEnds(float(emb), float(lm_head), sends_s)

    def _communication(self, num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TP all-reduces and PP sends, from the tables when given, else the link model."""
        size = num_tokens * self.activation_bytes_per_token
        outside = np.zeros(np.shape(num_tokens), dtype=bool)
        if self.all_reduce is None or self.tp == 1:
            total = self.roofline.tp_all_reduce_s(num_tokens)
        else:
            per_call, outside = self._look("all_reduce.csv size", self.all_reduce, size)
            total = 2 * self.model.num_layers * per_call
        if self.send_recv is None or self.pipeline_stages == 1:
            return total + self.roofline.pipeline_sends_s(num_tokens), outside
        for table, count in self.send_recv:
            per_send, out = self._look("send_recv.csv size", table, size)
            total, outside = total + count * per_send, outside | out
        return total, outside

    def _attention(self, query: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Attention of all layers for a (..., B) grid of requests: (seconds, outside)."""
        if self.decode_attention is None or self.prefill_attention is None:
            roofline_s = self.roofline.attention_per_layer_s(query, context)
            return self.model.num_layers * roofline_s, np.zeros(query.shape[:-1], dtype=bool)
        decoding = query == 1
        n_decode = decoding.sum(axis=-1)
        mean_kv = (context * decoding).sum(axis=-1) / np.maximum(n_decode, 1)
        decode, out_d = self._look(
            "attention decode", self.decode_attention, np.maximum(n_decode, 1), mean_kv, relevant=n_decode > 0
        )
        decode = np.where(n_decode > 0, decode, 0.0)
        prefill, out_p = self._look(
            "attention prefill", self.prefill_attention, context - query, query, relevant=~decoding
        )
        prefill = np.where(decoding, 0.0, prefill).sum(axis=-1)
        out_p = np.asarray(out_p.any(axis=-1))
        return self.model.num_layers * (decode + prefill), out_d | out_p

    def iteration_time_s(self, batch: Batch) -> float:
        if batch.size == 0:
            return 0.0
        tokens = np.array(float(batch.total_query_tokens))
        fixed, out_f = self._token_side(tokens, np.array(float(batch.size)))
        attention, out_a = self._attention(batch.query_tokens[None, :], batch.context_tokens[None, :])
        self._out_of_range += int(bool(out_f) or bool(out_a[0]))
        time_s = float(fixed + attention[0])
        check_durations(time_s, self.checked_source, f"a batch of {batch.size} requests")
        return time_s

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        return counted_decode_steps_s(self, context_tokens, num_steps)

    def decode_steps_outside(
        self, context_tokens: np.ndarray, num_steps: int
    ) -> tuple[np.ndarray, OutsideSteps]:
        size = len(context_tokens)
        if size == 0:
            return np.zeros(num_steps), OutsideSteps(np.zeros(num_steps, dtype=bool), {})
        contexts = context_tokens[None, :] + np.arange(num_steps)[:, None]
        self._deferred = {}
        try:
            fixed, out_f = self._token_side(np.array(float(size)), np.array(float(size)))
            attention, out_a = self._attention(np.ones_like(contexts), contexts)
            why = {name: np.logical_or.reduce([_per_step(m, num_steps) for m in masks])
                   for name, masks in self._deferred.items()}
        finally:
            self._deferred = None
        times_s = runnable_steps(fixed + attention, self.checked_source)
        return times_s, OutsideSteps(out_a | bool(out_f), why)

    def count_outside(self, outside: OutsideSteps, num_steps: int) -> None:
        count, why = outside.among_first(num_steps)
        self._out_of_range += count
        for name in why:
            self._warn(name)


def _per_step(mask: np.ndarray, num_steps: int) -> np.ndarray:
    """A table's out-of-range points over a decode run's steps (axis 0, or none: every step)."""
    steps = np.asarray(mask.any(axis=tuple(range(1, mask.ndim)))) if mask.ndim > 1 else mask
    return np.broadcast_to(steps, (num_steps,))


def _naming(key: str) -> contextlib.AbstractContextManager[None]:
    """A table's refusal ('cost: file ... not found') names the key that gave the file."""
    return errors_under(f"cost.{key}: ", drop="cost: ")


def _attention_tables(
    cfg: ProfileCostConfig, model: ModelSpec, tp: int
) -> tuple[SlicedTable2D | None, SlicedTable2D | None]:
    """(decode, prefill) attention tables from the configured source; (None, None): roofline."""
    if cfg.attention_csv:
        return vidur_attention(cfg.attention_csv, model, tp)
    if cfg.aiconfigurator_dir:
        return aiconfigurator_attention(cfg.aiconfigurator_dir, model, tp)
    return None, None
