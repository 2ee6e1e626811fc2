"""calibrate/layer_ops.py on the CPU: the steps the H200's kernel timings came from."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

from calibrate.layer_ops import main  # noqa: E402


def test_layer_ops_times_every_shape_up_to_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "ops.csv"
    main(["--model", "tiny", "--device", "cpu", "--max-tokens", "128", "--layers", "2",
          "--repeats", "2", "--out", str(out)])
    table = pd.read_csv(out)
    ops = table[table["kind"] == "token_ops"]
    assert list(ops["tokens"]) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert (ops["context"] == 0).all()
    attention = table[table["kind"] == "decode_attention"]
    # Only the decode shapes of at most 64 x max-tokens = 8,192 KV tokens.
    assert list(zip(attention["tokens"], attention["context"], strict=True)) == [(1, 1024), (8, 1024)]
    assert (table["time_s"] > 0).all()
