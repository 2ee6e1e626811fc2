"""`python -m calibrate kernels` (calibrate/layer_ops.py) on the CPU: the steps the H200's
kernel timings came from."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from calibrate.__main__ import main  # noqa: E402
from calibrate.layer_ops import measure, shard_shapes  # noqa: E402
from calibrate.model import SHAPES  # noqa: E402


def test_layer_ops_times_every_shape_up_to_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "ops.csv"
    assert main(["kernels", "--model", "tiny", "--device", "cpu", "--max-tokens", "128", "--layers", "2",
          "--repeats", "2", "--tensor-parallel", "1", "2", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == ["model", "tensor_parallel", "mode", "kind", "tokens", "context",
                                   "time_s"]
    assert (table["mode"] == "graph").all()
    for _, rows in table.groupby("tensor_parallel"):
        ops = rows[rows["kind"] == "token_ops"]
        assert list(ops["tokens"]) == [1, 2, 4, 8, 16, 32, 64, 128] and (ops["context"] == 0).all()
        decode = rows[rows["kind"] == "decode_attention"]
        # Only the decode shapes of at most 64 x max-tokens = 8,192 KV tokens.
        assert list(zip(decode["tokens"], decode["context"], strict=True)) == [(1, 1024), (8, 1024)]
        prefill = rows[rows["kind"] == "prefill_attention"]
        assert prefill.empty  # every prompt shape is longer than max-tokens
    assert (table["model"] == "tiny").all() and sorted(table["tensor_parallel"].unique()) == [1, 2]
    assert (table["time_s"] > 0).all()


def test_the_timed_tensors_come_from_a_generator_of_their_own() -> None:
    # They came from torch's global generator, never seeded: each run timed other values,
    # and a caller's torch stream moved under it.
    torch.manual_seed(1)
    before = torch.get_rng_state()
    rows = measure("tiny", [1], "cpu", layers=1, repeats=1, max_tokens=8, eager=False)
    assert len(rows) == 1 + 4  # the header and token_ops at 1, 2, 4 and 8 tokens
    assert torch.equal(torch.get_rng_state(), before)


def test_a_shard_holds_its_share_of_the_weights() -> None:
    """One rank's shard at TP 8 of Llama-2-70B (grouped-query, SwiGLU): an eighth of the
    query heads, one of its 8 KV heads and an eighth of the MLP's width; at TP 16 the KV
    head is replicated, not split."""
    shape = SHAPES["llama2-70b"]
    assert shard_shapes(shape, 8) == {"qkv": ((8 + 2) * 128, 8192), "out": (8192, 8 * 128),
                                      "up": (2 * 3584, 8192), "down": (8192, 3584)}
    assert shard_shapes(shape, 16)["qkv"] == ((4 + 2) * 128, 8192)
    assert shard_shapes(SHAPES["gpt3-13b"], 1)["up"] == (20480, 5120)  # GELU: no gate


@pytest.mark.parametrize(("args", "message"), [
    (["--tensor-parallel", "3"], "--tensor-parallel 3: expected a divisor of tiny's 4 heads"),
    (["--tensor-parallel", "0"], "argument --tensor-parallel: '0': expected an integer >= 1"),
    (["--model", "gpt5"], "--model = 'gpt5': expected one of"),
    (["--layers", "0"], "argument --layers: '0': expected an integer >= 1"),
    # 1e9 copies of tiny's 3 MiB layer allocated for 42 s before a traceback (under a 3 GB
    # cap; without one they take the machine's memory); 1e12 repeats ran for ever.
    (["--layers", "1000000000"], "--layers 1000000000: copies of tiny's layer at TP 1 take 3 MiB "
                                 "each; expected at most "),
    (["--repeats", "1000000000000"], "argument --repeats: '1000000000000': expected an integer "
                                     "from 1 to 10000"),
    (["--repeats", "1e23"], "argument --repeats: '1e23': expected an integer from 1 to 10000"),
    (["--repeats", "0"], "argument --repeats: '0': expected an integer from 1 to 10000"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               args: list[str], message: str) -> None:
    try:
        code = main(["kernels", "--model", "tiny", "--device", "cpu", *args,
                     "--out", str(tmp_path / "x.csv")])
    except SystemExit as e:  # argparse's own refusals
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.csv").exists()


def test_an_existing_out_is_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.csv"
    out.write_text("mine\n")
    base = ["kernels", "--model", "tiny", "--device", "cpu", "--max-tokens", "1", "--layers", "1",
            "--repeats", "1", "--out", str(out)]
    assert main(base) == 2 and "pass --force" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    assert main([*base, "--force"]) == 0 and out.read_text().startswith("model,")


def test_eager_rows_say_so(tmp_path: Path) -> None:
    out = tmp_path / "eager.csv"
    assert main(["kernels", "--model", "tiny", "--device", "cpu", "--max-tokens", "2", "--layers", "1",
          "--repeats", "1", "--eager", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert (table["mode"] == "eager").all() and list(table["tokens"]) == [1, 2]


def test_a_degree_must_split_or_replicate_the_kv_heads_whole() -> None:
    """Llama-3-8B's 8 KV heads over 32 query heads: TP 16 replicates each KV head on two
    ranks (allowed), while a made-up 12 KV heads at TP 8 would split unevenly."""
    from dataclasses import replace

    from calibrate.layer_ops import check_degree
    from orcasim.config import ScenarioError

    check_degree("llama3-8b", 16)
    check_degree("llama3-8b", 4)
    SHAPES["_odd"] = replace(SHAPES["llama3-8b"], n_kv_heads=12, n_heads=48)
    try:
        with pytest.raises(ScenarioError, match="12 KV heads split over it neither evenly"):
            check_degree("_odd", 8)
    finally:
        del SHAPES["_odd"]
