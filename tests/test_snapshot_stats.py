"""Snapshot statistics against a float64 NumPy reference, on fresh random tensors.

Both torch paths are checked: the one the snapshot thread runs on CPU copies
(``summarise_copy``) and the one that is enqueued on a GPU's stream
(``device_summary``, run here on CPU tensors: it is the same tensor code).
Every run draws new values; a failure prints the seed that reproduces it.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cirron.instrumentors.torch_snapshot import device_summary, summarise_copy  # noqa: E402
from cirron.snapshots.records import event_attributes  # noqa: E402

SEED = secrets.randbits(32)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8]


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(SEED)


def host_path(tensor):
    return summarise_copy(tensor.clone())  # it overwrites its copy


def device_path(tensor):
    return device_summary(tensor).tolist()


PATHS = [pytest.param(host_path, id="host"), pytest.param(device_path, id="device")]


def stats(path, tensor):
    return event_attributes("weight", "x", tuple(tensor.shape), path(tensor))


def reference(tensor) -> dict:
    """What the event should say, from the tensor's values in float64."""
    values = tensor.double().numpy().ravel()
    finite = values[np.isfinite(values)]
    expected = {
        "nan_count": int(np.isnan(values).sum()),
        "inf_count": int(np.isinf(values).sum()),
    }
    if finite.size == 0:
        return expected | {"empty": True}
    low, high = finite.min(), finite.max()
    if high > low:
        histogram = np.histogram(finite, bins=16, range=(low, high))[0]
    else:
        histogram = np.array([finite.size] + [0] * 15)
    return expected | {
        "empty": False,
        "mean": finite.mean(),
        "std": finite.std(),
        "min": low,
        "max": high,
        "norm": np.linalg.norm(finite),
        "histogram": histogram,
    }


def assert_matches(got: dict, tensor) -> None:
    want = reference(tensor)
    note = f"seed {SEED}, {tensor.dtype}, shape {tuple(tensor.shape)}"
    assert got["nan_count"] == want["nan_count"], note
    assert got["inf_count"] == want["inf_count"], note
    if want["empty"]:
        assert math.isnan(got["mean"]) and math.isnan(got["min"]), note
        assert got["norm"] == 0.0 and got["histogram"] == [0] * 16, note
        return
    scale = abs(want["mean"]) + want["std"]
    assert got["mean"] == pytest.approx(want["mean"], abs=1e-5 * scale), note
    assert got["std"] == pytest.approx(want["std"], rel=1e-4, abs=1e-7 * scale), note
    assert got["norm"] == pytest.approx(want["norm"], rel=1e-5), note
    assert (got["min"], got["max"]) == (want["min"], want["max"]), note  # exact: no rounding
    assert got["histogram_range"] == [want["min"], want["max"]], note
    histogram = np.array(got["histogram"])
    assert histogram.sum() == want["histogram"].sum(), note
    # A value within float32 rounding of a bin edge may land on either side of it.
    assert np.abs(histogram - want["histogram"]).sum() <= 2 + tensor.numel() // 100_000, note


def random_tensor(dtype, shape, generator):
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 3 + 0.5).to(dtype)
    return torch.randint(-100, 100, shape, generator=generator, dtype=dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stats_of_random_tensors_match_numpy_in_float64(path, dtype, generator):
    for shape in [(257, 33), (4096,), (3, 5, 7), ()]:
        tensor = random_tensor(dtype, shape, generator)
        assert_matches(stats(path, tensor), tensor)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_nan_and_inf_are_counted_and_the_stats_are_over_the_finite_values(path, dtype, generator):
    tensor = random_tensor(dtype, (50, 40), generator)
    flat = tensor.view(-1)
    positions = torch.randperm(flat.numel(), generator=generator)
    flat[positions[:7]] = float("nan")
    flat[positions[7:10]] = float("inf")
    flat[positions[10:12]] = -float("inf")
    got = stats(path, tensor)
    assert (got["nan_count"], got["inf_count"]) == (7, 5)
    assert math.isfinite(got["mean"]) and math.isfinite(got["max"])
    assert_matches(got, tensor)


@pytest.mark.parametrize("path", PATHS)
def test_tensors_with_nothing_finite_or_nothing_at_all_still_get_a_record(path):
    for tensor in [torch.empty(0), torch.empty(3, 0), torch.full((4,), float("nan"))]:
        got = stats(path, tensor)
        assert_matches(got, tensor)
    got = stats(path, torch.tensor([float("inf"), -float("inf"), float("nan")]))
    assert (got["nan_count"], got["inf_count"], got["norm"]) == (1, 2, 0.0)
    assert math.isnan(got["std"])


@pytest.mark.parametrize("path", PATHS)
def test_a_constant_tensor_has_zero_std_and_one_full_bin(path):
    got = stats(path, torch.full((10, 10), 0.25))
    assert (got["mean"], got["std"], got["min"], got["max"]) == (0.25, 0.0, 0.25, 0.25)
    assert got["histogram"] == [100] + [0] * 15
    assert got["norm"] == pytest.approx(2.5)


@pytest.mark.parametrize("path", PATHS)
def test_a_small_spread_around_a_large_mean_keeps_its_std(path, generator):
    # LayerNorm weights: mean 1, std 1e-4. Sum-of-squares minus squared mean would lose it.
    tensor = 1 + torch.randn(100_000, generator=generator) * 1e-4
    assert_matches(stats(path, tensor), tensor)


def test_a_large_tensor_is_accurate_in_float32(generator):
    tensor = torch.randn(2_000_000, generator=generator) * 0.02 + 0.001
    assert_matches(stats(host_path, tensor), tensor)
