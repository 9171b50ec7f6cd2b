"""Tests of the Pollux OSDI'21 profile loader (pollux.sim.profiles)."""

from __future__ import annotations

import json
import math
import pickle
import re
import time
from pathlib import Path

import numpy as np
import pytest

from pollux.goodput import BatchLimits, GradStats
from pollux.sim.profiles import (
    AppMeta,
    AppProfile,
    default_metadata,
    infer_metadata,
    load_profile,
    load_profiles,
    placement_key,
)

SHARED = Path(__file__).resolve().parents[2] / "shared/data/pollux-osdi21/traces"
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


# --------------------------------------------------------------------------------------------------
# Fixture profiles: step/sync times are an affine function of (nodes, replicas, m), so any linear
# interpolation over a triangulation of them reproduces the function exactly inside the hull.


def step_fn(nodes: float, replicas: float, m: float) -> float:
    return 0.05 + 0.01 * m + 0.002 * replicas + 0.01 * nodes


def sync_fn(nodes: float, replicas: float, m: float) -> float:
    return 0.001 * replicas + 0.004 * nodes


PLACEMENTS = ("1", "2", "3", "4", "11", "22", "44", "111", "1111")
SCALABILITY = ((6, 6), (6, 12), (6, 24), (8, 8), (8, 32))
MS = (8, 16, 32)
VALIDATION = {
    8: [(10.0, 10, 0.5, 1.0, 10.0), (20.0, 20, 0.6, 2.0, 20.0), (30.0, 30, 0.7, 3.0, 30.0)],
    32: [(9.0, 3, 0.4, 3.0, 30.0), (21.0, 6, 0.5, 4.0, 40.0), (28.0, 9, 0.6, 5.0, 50.0)],
}
TOY_META = AppMeta("toy", 8, 32, 8, 32, 3, "sgd", True)


def shape_of(p: str) -> tuple[int, int]:
    return len(p), sum(int(c) for c in p)


def placement_lines(overrides: dict[tuple[str, int], tuple[float, float]] | None = None) -> list[str]:
    lines = ["placement,local_bsz,step_time,sync_time"]
    for p in PLACEMENTS:
        n, r = shape_of(p)
        ms = (8, 16) if p == "2" else MS  # "2" measured over a narrower range of local batches
        for m in ms:
            st, sy = (overrides or {}).get((p, m), (step_fn(n, r, m), sync_fn(n, r, m)))
            lines.append(f"{p},{m},{st!r},{sy!r}")
    return lines


def scalability_lines() -> list[str]:
    lines = ["num_nodes,num_replicas,local_bsz,step_time,sync_time"]
    for n, r in SCALABILITY:
        for m in MS:
            lines.append(f"{n},{r},{m},{step_fn(n, r, m)!r},{sync_fn(n, r, m)!r}")
    return lines


def write_profile(
    root: Path,
    name: str = "toy",
    placements: list[str] | None = None,
    scalability: list[str] | None = None,
    validation: dict[int, list[tuple]] | None = None,
) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "placements.csv").write_text("\n".join(placements or placement_lines()) + "\n")
    (d / "scalability.csv").write_text("\n".join(scalability or scalability_lines()) + "\n")
    for b, rows in (validation or VALIDATION).items():
        text = "progress,iteration,metric,grad_sqr,grad_var\n"
        text += "".join(",".join(repr(x) for x in row) + "\n" for row in rows)
        (d / f"validation-{b}.csv").write_text(text)
    return d


@pytest.fixture
def toy(tmp_path: Path) -> AppProfile:
    return load_profile(write_profile(tmp_path), TOY_META)


# --------------------------------------------------------------------------------------------------
# placement_key


@pytest.mark.parametrize(
    ("row", "key"),
    [
        ((0, 2, 1, 0, 3), "132"),
        ((2, 2), "22"),
        ((4, 1), "14"),
        ((3, 1, 2), "123"),
        ((2, 1, 2, 1), "1212"),
        ((0, 0, 4), "4"),
        ((0, 0), ""),
        ((), ""),
        (np.array([0, 3, 0, 1, 1]), "113"),
        ([2.0, 1.0], "12"),
        ("0213", "132"),
        ((12, 1), "1,12"),
    ],
)
def test_placement_key(row, key):
    assert placement_key(row) == key


@pytest.mark.parametrize("row", [(1, -1), (1.5, 2), (float("nan"),), "2x"])
def test_placement_key_rejects_bad_rows(row):
    with pytest.raises(ValueError, match="placement"):
        placement_key(row)


# --------------------------------------------------------------------------------------------------
# Throughput lookups on the fixture


def test_measured_placement_exact_at_rows(toy):
    for p in PLACEMENTS:
        n, r = shape_of(p)
        for m in (8, 16) if p == "2" else MS:
            assert toy.step_time(tuple(int(c) for c in p), m) == (step_fn(n, r, m), sync_fn(n, r, m))


def test_measured_placement_linear_between_rows(tmp_path):
    # A placement whose measurements are not linear in m: the lookup follows its own rows (np.interp).
    bump = (step_fn(1, 4, 16) + 0.05, sync_fn(1, 4, 16) + 0.01)
    prof = load_profile(write_profile(tmp_path, placements=placement_lines({("4", 16): bump})), TOY_META)
    assert prof.step_time((4,), 16) == bump
    st, sy = prof.step_time((0, 4, 0), 12)
    assert st == pytest.approx((step_fn(1, 4, 8) + bump[0]) / 2, rel=1e-12)
    assert sy == pytest.approx((sync_fn(1, 4, 8) + bump[1]) / 2, rel=1e-12)
    st, sy = prof.step_time("4", 24)
    assert st == pytest.approx((bump[0] + step_fn(1, 4, 32)) / 2, rel=1e-12)


def test_rotations_and_zeros_share_a_placement(toy):
    assert toy.step_time((0, 1, 0, 1, 0, 1), 16) == toy.step_time("111", 16)
    assert toy.step_time(np.array([0, 4, 4]), 8) == toy.step_time((4, 4), 8)
    assert toy.measured_placements == tuple(sorted(PLACEMENTS))
    assert toy.placement_range((0, 2)) == (8.0, 16.0)
    assert toy.placement_range((1, 3)) is None


def test_unmeasured_placement_falls_back_to_nk_interpolation(toy):
    # "12": 2 nodes, 3 replicas — not measured; inside the hull of the (nodes, replicas, m) points.
    for m in (8, 12, 20, 32):
        st, sy = toy.step_time((1, 0, 2), m)
        assert st == pytest.approx(step_fn(2, 3, m), rel=1e-9)
        assert sy == pytest.approx(sync_fn(2, 3, m), rel=1e-9)
        assert (st, sy) == toy.step_time_nk(2, 3, m)
    # Five nodes is always interpolated (between the 4-node placements and 6-node scalability rows).
    st, sy = toy.step_time((1, 1, 1, 1, 1), 16)
    assert st == pytest.approx(step_fn(5, 5, 16), rel=1e-9)
    assert sy == pytest.approx(sync_fn(5, 5, 16), rel=1e-9)


def test_measured_placement_outside_its_range_falls_back(toy):
    # "2" is measured for m in [8, 16] only: m = 24 uses the (nodes, replicas, m) interpolation.
    st, sy = toy.step_time((2,), 24)
    assert st == pytest.approx(step_fn(1, 2, 24), rel=1e-9)
    assert sy == pytest.approx(sync_fn(1, 2, 24), rel=1e-9)


def test_fallback_averages_rows_per_key(tmp_path):
    # "22" and "13" both map to (2 nodes, 4 replicas): the interpolator uses their mean.
    lines = placement_lines({("22", 16): (step_fn(2, 4, 16) + 0.1, sync_fn(2, 4, 16) + 0.005)})
    lines.append(f"13,16,{step_fn(2, 4, 16) - 0.1!r},{sync_fn(2, 4, 16) - 0.005!r}")
    prof = load_profile(write_profile(tmp_path, placements=lines), TOY_META)
    st, sy = prof.step_time_nk(2, 4, 16)
    assert st == pytest.approx(step_fn(2, 4, 16), rel=1e-9)
    assert sy == pytest.approx(sync_fn(2, 4, 16), abs=1e-12)
    assert prof.step_time((1, 3), 16)[0] == pytest.approx(step_fn(2, 4, 16) - 0.1, rel=1e-12)


@pytest.mark.parametrize(
    ("placement", "m"),
    [
        ((1,), 64),  # local batch above every measurement
        ((1,), 4),  # below every measurement
        ((8,), 16),  # 8 GPUs on one node: never measured, outside the hull
        ((4,) * 16, 16),  # 16 nodes: beyond the scalability rows
        ((0, 0), 16),  # no GPUs
        ((1,), 0),
        ((1,), float("nan")),
    ],
)
def test_infeasible_is_nan(toy, placement, m):
    st, sy = toy.step_time(placement, m)
    assert math.isnan(st) and math.isnan(sy)


def test_step_time_nk_validation_and_vectorised(toy):
    assert all(math.isnan(x) for x in toy.step_time_nk(2, 1, 16))  # fewer replicas than nodes
    assert all(math.isnan(x) for x in toy.step_time_nk(0, 0, 16))
    st, sy = toy.step_times_nk(np.array([2, 5, 1]), np.array([3, 5, 8]), 16)
    assert st[0] == pytest.approx(step_fn(2, 3, 16)) and st[1] == pytest.approx(step_fn(5, 5, 16))
    assert math.isnan(st[2]) and math.isnan(sy[2])
    assert st[0] == toy.step_time_nk(2, 3, 16)[0]


def test_throughput_rows(toy):
    nodes, replicas, m, st, sy = toy.throughput_rows()
    n_rows = sum(2 if p == "2" else 3 for p in PLACEMENTS) + len(SCALABILITY) * len(MS)
    assert len(nodes) == len(replicas) == len(m) == len(st) == len(sy) == n_rows
    np.testing.assert_allclose(st, step_fn(nodes, replicas, m), rtol=1e-12)
    np.testing.assert_allclose(sy, sync_fn(nodes, replicas, m), rtol=1e-12)


def test_pickle_round_trip(toy):
    clone = pickle.loads(pickle.dumps(toy))
    assert clone.step_time((1, 0, 2), 20) == toy.step_time((1, 0, 2), 20)
    assert clone.grad_stats(1, 16) == toy.grad_stats(1, 16)
    np.testing.assert_array_equal(clone.epoch_ends, toy.epoch_ends)


# --------------------------------------------------------------------------------------------------
# Validation data on the fixture


def test_epoch_ends_is_min_over_batch_sizes(toy):
    np.testing.assert_array_equal(toy.epoch_ends, [9.0, 20.0, 28.0])
    np.testing.assert_array_equal(toy.batch_sizes, [8.0, 32.0])
    assert toy.epoch_ends.shape == (TOY_META.epochs,)
    assert toy.completion_progress == 28.0
    with pytest.raises(ValueError):
        toy.epoch_ends[0] = 1.0  # read-only


@pytest.mark.parametrize(
    ("progress", "epoch"),
    [(0.0, 0), (8.99, 0), (9.0, 1), (19.9, 1), (20.0, 2), (27.9, 2), (28.0, 3), (1e9, 3)],
)
def test_epoch_at(toy, progress, epoch):
    assert toy.epoch_at(progress) == epoch


def test_grad_stats_interpolation_and_clamping(toy):
    g = toy.grad_stats(0, 16)
    assert isinstance(g, GradStats)
    assert g.sqr == pytest.approx(1.0 + 2.0 * 8 / 24)
    assert g.var == pytest.approx(10.0 + 20.0 * 8 / 24)
    assert toy.grad_stats(1, 8) == GradStats(2.0, 20.0)
    assert toy.grad_stats(1, 32) == GradStats(4.0, 40.0)
    assert toy.grad_stats(2, 4) == GradStats(3.0, 30.0)  # below the measured batch sizes
    assert toy.grad_stats(2, 1000) == GradStats(5.0, 50.0)  # above
    assert toy.grad_stats(7, 32) == GradStats(5.0, 50.0)  # epoch clamped to the last
    assert toy.grad_stats(-1, 8) == GradStats(1.0, 10.0)


def test_epochs_follow_metadata(tmp_path):
    d = write_profile(tmp_path)
    short = load_profile(d, AppMeta("toy", 8, 32, 8, 32, 2, "sgd", True))
    np.testing.assert_array_equal(short.epoch_ends, [9.0, 20.0])
    assert short.epoch_at(20.0) == 2
    with pytest.raises(ValueError, match=r"validation-8\.csv.*3 epoch row.*epochs = 4"):
        load_profile(d, AppMeta("toy", 8, 32, 8, 32, 4, "sgd", True))


def test_metadata_inferred_when_unknown(tmp_path):
    d = write_profile(tmp_path, name="myapp")
    prof = load_profile(d)
    assert prof.meta == AppMeta("myapp", 8, 32, 8, 32, 3, "sgd", True)
    assert infer_metadata(d) == prof.meta
    profs = load_profiles(tmp_path)
    assert list(profs) == ["myapp"] and profs["myapp"].meta == prof.meta


# --------------------------------------------------------------------------------------------------
# Metadata


def test_default_metadata_and_limits():
    meta = default_metadata()
    assert set(meta) == set(APPS)
    assert meta["bert"].optimizer == "adam" and meta["ncf"].optimizer == "adam"
    assert {a for a in APPS if meta[a].optimizer == "sgd"} == {"cifar10", "deepspeech2", "imagenet", "yolov3"}
    assert not meta["yolov3"].metric_higher_is_better
    assert (meta["yolov3"].max_local_bsz, meta["imagenet"].epochs) == (8, 90)
    lim = meta["cifar10"].limits()
    assert isinstance(lim, BatchLimits)
    assert (lim.init_batch_size, lim.max_batch_size, lim.min_local_bsz, lim.max_local_bsz) == (
        128,
        4096,
        32,
        1024,
    )
    assert lim.accumulation and not meta["cifar10"].limits(accumulation=False).accumulation
    data = json.loads((Path(__file__).resolve().parents[1] / "src/pollux/sim/applications.json").read_text())
    assert data["provenance"]


def write_meta(path: Path, apps: dict) -> Path:
    path.write_text(json.dumps({"provenance": "test", "applications": apps}))
    return path


GOOD_ENTRY = {
    "init_batch_size": 8,
    "max_batch_size": 32,
    "min_local_bsz": 8,
    "max_local_bsz": 32,
    "epochs": 3,
    "optimizer": "sgd",
    "metric_higher_is_better": True,
}


def test_metadata_override_file(tmp_path):
    path = write_meta(tmp_path / "meta.json", {"toy": {**GOOD_ENTRY, "epochs": 2}})
    meta = default_metadata(path)
    assert meta["toy"].epochs == 2
    write_profile(tmp_path / "root")
    profs = load_profiles(tmp_path / "root", metadata=meta)
    assert profs["toy"].epoch_ends.shape == (2,)


@pytest.mark.parametrize(
    ("entry", "pattern"),
    [
        (
            {k: v for k, v in GOOD_ENTRY.items() if k != "epochs"},
            r"applications\.toy: missing field\(s\) epochs",
        ),
        ({**GOOD_ENTRY, "colour": 1}, r"applications\.toy: unknown field\(s\) colour"),
        ({**GOOD_ENTRY, "optimizer": "rmsprop"}, r"applications\.toy\.optimizer"),
        ({**GOOD_ENTRY, "max_batch_size": 4}, r"applications\.toy\.max_batch_size"),
        ({**GOOD_ENTRY, "min_local_bsz": 2.5}, r"applications\.toy\.min_local_bsz"),
        ({**GOOD_ENTRY, "epochs": "3"}, r"applications\.toy\.epochs"),
        ({**GOOD_ENTRY, "metric_higher_is_better": 1}, r"applications\.toy\.metric_higher_is_better"),
    ],
)
def test_bad_metadata_names_file_and_field(tmp_path, entry, pattern):
    path = write_meta(tmp_path / "meta.json", {"toy": entry})
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + pattern):
        default_metadata(path)


def test_bad_metadata_json(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text('{\n  "applications": {\n    "toy": ,\n}')
    with pytest.raises(ValueError, match=re.escape(str(path)) + ", line 3: invalid JSON"):
        default_metadata(path)
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        default_metadata(tmp_path / "nope.json")


# --------------------------------------------------------------------------------------------------
# Malformed files: every error names the file and the line (and the field)


def edit_line(path: Path, line: int, text: str | None) -> None:
    lines = path.read_text().splitlines()
    if text is None:
        del lines[line - 1]
    else:
        lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


MALFORMED = [
    (
        "placements.csv",
        1,
        "placement,local_bsz,step_time",
        r"placements\.csv, line 1: missing column.*sync_time",
    ),
    ("placements.csv", 3, "1,16,fast,0.0", r"placements\.csv, line 3, field step_time: not a number"),
    (
        "placements.csv",
        4,
        "1,32,0.3,-0.01",
        r"placements\.csv, line 4, field sync_time: must be non-negative",
    ),
    ("placements.csv", 2, "1,8,nan,0.0", r"placements\.csv, line 2, field step_time: must be finite"),
    ("placements.csv", 5, "2x,8,0.1,0.0", r"placements\.csv, line 5, field placement: bad placement string"),
    ("placements.csv", 5, ",8,0.1,0.0", r"placements\.csv, line 5, field placement: bad placement string"),
    ("placements.csv", 5, "00,8,0.1,0.0", r"placements\.csv, line 5, field placement: bad placement string"),
    ("placements.csv", 6, "2,8,0.1", r"placements\.csv, line 6: expected 4 fields, got 3"),
    ("placements.csv", 2, "1,0,0.1,0.0", r"placements\.csv, line 2, field local_bsz: must be positive"),
    (
        "scalability.csv",
        1,
        "num_nodes,local_bsz,step_time,sync_time",
        r"scalability\.csv, line 1: missing.*num_replicas",
    ),
    (
        "scalability.csv",
        3,
        "6,6.5,16,0.1,0.01",
        r"scalability\.csv, line 3, field num_replicas: must be an integer",
    ),
    (
        "scalability.csv",
        4,
        "6,4,32,0.1,0.01",
        r"scalability\.csv, line 4, field num_replicas: 4 replicas on 6 nodes",
    ),
    ("scalability.csv", 2, "6,6,8,0.1,inf", r"scalability\.csv, line 2, field sync_time: must be finite"),
    ("validation-32.csv", 3, "21.0,6,0.5,4.0,", r"validation-32\.csv, line 3, field grad_var: not a number"),
    (
        "validation-32.csv",
        2,
        "9.0,3,0.4,-3.0,30.0",
        r"validation-32\.csv, line 2, field grad_sqr: must be non-negative",
    ),
    (
        "validation-8.csv",
        4,
        "15.0,30,0.7,3.0,30.0",
        r"validation-8\.csv, line 4, field progress: 15\.0 does not increase",
    ),
    (
        "validation-8.csv",
        4,
        None,
        r"validation files differ in row count.*validation-8\.csv \(2\).*validation-32\.csv \(3\)",
    ),
]


@pytest.mark.parametrize(("file", "line", "text", "pattern"), MALFORMED)
def test_malformed_files_name_file_and_line(tmp_path, file, line, text, pattern):
    d = write_profile(tmp_path)
    edit_line(d / file, line, text)
    with pytest.raises(ValueError, match=pattern) as info:
        load_profile(d, TOY_META)
    assert str(d / file) in str(info.value) or (file == "validation-8.csv" and text is None)


@pytest.mark.parametrize("file", ["placements.csv", "scalability.csv"])
def test_missing_file(tmp_path, file):
    d = write_profile(tmp_path)
    (d / file).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(d / file))):
        load_profile(d, TOY_META)


def test_missing_or_misnamed_validation_files(tmp_path):
    d = write_profile(tmp_path)
    (d / "validation-8.csv").rename(d / "validation-abc.csv")
    with pytest.raises(ValueError, match=r"validation-abc\.csv: bad validation file name"):
        load_profile(d, TOY_META)
    for p in d.glob("validation-*.csv"):
        p.unlink()
    with pytest.raises(FileNotFoundError, match=r"no validation-<B>\.csv"):
        load_profile(d, TOY_META)


def test_empty_and_headless_files(tmp_path):
    d = write_profile(tmp_path)
    (d / "scalability.csv").write_text("")
    with pytest.raises(ValueError, match=re.escape(str(d / "scalability.csv")) + ": empty file"):
        load_profile(d, TOY_META)
    (d / "scalability.csv").write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
    with pytest.raises(ValueError, match=re.escape(str(d / "scalability.csv")) + ": no data rows"):
        load_profile(d, TOY_META)


def test_missing_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_profile(tmp_path / "nope", TOY_META)
    with pytest.raises(FileNotFoundError, match="nope"):
        load_profiles(tmp_path / "nope")
    write_profile(tmp_path)
    with pytest.raises(FileNotFoundError, match="other"):
        load_profiles(tmp_path, apps=["toy", "other"])


# --------------------------------------------------------------------------------------------------
# The shared Pollux OSDI'21 data


@pytest.fixture(scope="module")
def shared() -> dict[str, AppProfile]:
    if not SHARED.is_dir():
        pytest.skip(f"shared Pollux OSDI'21 traces not found at {SHARED}")
    return load_profiles(SHARED)


def test_shared_all_apps_load(shared):
    assert set(shared) == set(APPS)
    meta = default_metadata()
    for app, prof in shared.items():
        assert prof.meta == meta[app]
        assert len(prof.measured_placements) == 108
        for b in prof.batch_sizes:
            assert len(np.loadtxt(SHARED / app / f"validation-{int(b)}.csv", delimiter=",", skiprows=1)) == (
                prof.meta.epochs
            )
        assert prof.epoch_ends.shape == (prof.meta.epochs,)
        assert np.all(np.diff(prof.epoch_ends) > 0)
        # The metadata agrees with the data (SPEC §7): M0 / max = smallest / largest validated B, local
        # bounds = min / max over placements.csv (yolov3's max 8 is an override of the data's 16).
        assert (prof.batch_sizes[0], prof.batch_sizes[-1]) == (
            prof.meta.init_batch_size,
            prof.meta.max_batch_size,
        )
        lbs = np.loadtxt(SHARED / app / "placements.csv", delimiter=",", skiprows=1, usecols=1)
        assert lbs.min() == prof.meta.min_local_bsz
        assert lbs.max() == (16 if app == "yolov3" else prof.meta.max_local_bsz)
        assert prof.epoch_at(prof.completion_progress) == prof.meta.epochs
        g = prof.grad_stats(0, prof.meta.init_batch_size)
        assert g.sqr >= 0 and g.var >= 0


def test_shared_placement_rows_reproduced_exactly(shared):
    import csv

    for app, prof in shared.items():
        with (SHARED / app / "placements.csv").open() as f:
            for row in csv.DictReader(f):
                digits = tuple(int(c) for c in row["placement"])
                got = prof.step_time(digits, float(row["local_bsz"]))
                assert got == (float(row["step_time"]), float(row["sync_time"])), (app, row)


def test_shared_five_nodes_and_large_configs(shared):
    c = shared["cifar10"]
    st, sy = c.step_time((4, 4, 4, 4, 4), 128)
    assert math.isfinite(st) and math.isfinite(sy) and st > sy > 0
    assert (st, sy) == c.step_time_nk(5, 20, 128)
    # Between the 4-node placement and 6-node scalability measurements.
    assert c.step_time((4, 4, 4, 4), 128)[0] < st < c.step_time_nk(6, 24, 128)[0]
    for app, prof in shared.items():
        m = prof.meta.min_local_bsz
        assert all(math.isfinite(x) for x in prof.step_time((1, 1, 1, 1, 1), m)), app
        assert all(math.isfinite(x) for x in prof.step_time((4,) * 16, m)), app
        assert all(math.isnan(x) for x in prof.step_time((4,) * 17, m)), app
    # ncf reaches 32768 only on one GPU.
    assert math.isfinite(shared["ncf"].step_time((1,), 32768)[0])


def test_shared_cache_hit_is_cheap(shared):
    prof = shared["cifar10"]
    row = np.array([0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    expected = prof.step_time(row, 100)
    n = 10_000
    t0 = time.perf_counter()
    for _ in range(n):
        prof.step_time(row, 100)
    per_call = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        prof.step_time_nk(5, 20, 128)
    per_nk = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        prof.grad_stats(10, 300)
    per_grad = (time.perf_counter() - t0) / n
    print(
        f"cache-hit lookups: step_time {per_call * 1e6:.2f} us, step_time_nk {per_nk * 1e6:.2f} us, "
        f"grad_stats {per_grad * 1e6:.2f} us"
    )
    assert prof.step_time(row, 100) == expected
