"""benchmarks/cell_fingerprint.py: the digests it compares commits by repeat bit for bit within a checkout and see
a change of the training (here another seed)."""

from __future__ import annotations

from benchmark_scripts import load_benchmark


def test_a_cell_fingerprint_repeats_and_tells_another_training_apart():
    benchmark = load_benchmark("cell_fingerprint")
    config = benchmark.shortened_cell("supervised", "np", steps=1, images=2)
    assert (config.schedule.max_steps, config.evaluation.max_images, tuple(config.evaluation.corruptions)) == (1, 2, ())
    first, again = benchmark.fingerprint(config), benchmark.fingerprint(config)
    assert first == again and first["steps"] == 1 and set(benchmark.KEYS) <= set(first)
    other = benchmark.fingerprint(benchmark.shortened_cell("supervised", "np", seed=1, steps=1, images=2))
    assert other["cell_id"] != first["cell_id"] and other["parameters"] != first["parameters"]
