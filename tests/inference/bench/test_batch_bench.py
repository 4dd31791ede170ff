"""The continuous batching benchmark (`python -m inference.bench batch`) end to end on a tiny
random model: every stream count's row and the keys the issue reads. Its speeds are not
asserted (benchmarks, not tests, hold speed targets): only that they are measured."""

from __future__ import annotations

from inference.bench import batch


def test_the_quick_run_prints_each_counts_best_run_and_the_speedups(capsys) -> None:
    assert batch.main(["--quick", "--model", "tiny-llama", "--max-new-tokens", "3", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["1", "4", "8"]  # one row per stream count
    keys = dict(pair.split("=") for pair in lines[-1].split())
    assert keys["batch_speedup_1"] == "1"
    rates = {n: float(keys[f"aggregate_tok_s_{n}"]) for n in (1, 4, 8)}
    assert all(rate > 0 for rate in rates.values())
    assert abs(float(keys["batch_speedup_8"]) - rates[8] / rates[1]) < 0.01 * rates[8] / rates[1]  # 4 digits printed
    assert float(keys["single_stream_ratio"]) > 0
