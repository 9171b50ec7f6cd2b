"""The hints contract (SPEC §8): schema, validation naming the field, build and conversion to a model."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.hints import (
    SCHEMA_PATH,
    HintsError,
    build_hints,
    hints_path,
    hints_to_model,
    hints_to_type_models,
    load_schema,
    merge_type_profiles,
    validate_hints,
)

PARAMS = ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23)
GRAD = GradStats(sqr=8.95, var=5.07)


def make_hints(**overrides):
    kwargs = dict(params=PARAMS, grad=GRAD, init_batch_size=128, max_batch_size=4096,
                  local_bsz_bounds=(32, 1024), accumulation=True, max_replicas_seen=4,
                  progress=12345.5, epoch=3)
    kwargs.update(overrides)
    return build_hints(**kwargs)


def test_schema_is_valid_draft_2020_12_and_shipped_in_package():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("/draft/2020-12/schema")
    assert SCHEMA_PATH.name == "hints-v3.json" and SCHEMA_PATH.parent.parent.name == "pollux"
    assert schema["$id"].endswith("hints-v3") and "version 3" in schema["title"]
    assert schema["properties"]["version"]["const"] == 3
    # Every field is required except the optional LB-BSP "balance" object (issue 12), the GPU
    # type fields of version 2 (issue 13) and what the job runs now, of version 3 (issue 35).
    assert set(schema["required"]) == set(schema["properties"]) - {"balance", "gpu_type", "types", "current"}


def test_build_hints_round_trips_through_json_and_schema():
    hints = make_hints()
    jsonschema.validate(hints, load_schema(), cls=jsonschema.Draft202012Validator)
    text = json.dumps(hints, allow_nan=False)
    again = validate_hints(json.loads(text))
    assert again == hints
    assert hints["version"] == 3
    assert hints["throughput"] == PARAMS.to_dict()
    assert hints["grad"] == {"sqr": 8.95, "var": 5.07}
    assert hints["local_bsz_bounds"] == [32, 1024]
    assert hints["accumulation"] is True


def test_validate_normalises_types():
    raw = make_hints()
    raw["init_batch_size"] = 128.0
    raw["epoch"] = np.int64(3)
    raw["progress"] = 7                       # integral number in a float field
    raw["local_bsz_bounds"] = (np.int32(32), 1024.0)
    raw["accumulation"] = np.bool_(False)
    raw["throughput"] = {k: np.float32(v) if k == "gamma" else v for k, v in raw["throughput"].items()}
    out = validate_hints(raw)
    assert type(out["init_batch_size"]) is int and out["init_batch_size"] == 128
    assert type(out["epoch"]) is int
    assert type(out["progress"]) is float and out["progress"] == 7.0
    assert out["local_bsz_bounds"] == [32, 1024] and all(type(b) is int for b in out["local_bsz_bounds"])
    assert out["accumulation"] is False
    assert type(out["throughput"]["gamma"]) is float
    assert raw["local_bsz_bounds"] == (np.int32(32), 1024.0)   # input untouched


def test_build_hints_defaults_for_fixed_batch_and_open_bounds():
    hints = make_hints(max_batch_size=None, local_bsz_bounds=None, accumulation=False)
    assert hints["max_batch_size"] == 128
    assert hints["local_bsz_bounds"] == [1, 128]
    hints = make_hints(local_bsz_bounds=(16, None))
    assert hints["local_bsz_bounds"] == [16, 4096]


def _set(obj, path, value):
    *parents, last = path
    for key in parents:
        obj = obj[key]
    obj[last] = value


def _delete(obj, path):
    *parents, last = path
    for key in parents:
        obj = obj[key]
    del obj[last]


VIOLATIONS = [
    # (description, mutation, expected field)
    ("nan", lambda h: _set(h, ["throughput", "alpha_grad"], math.nan), "throughput.alpha_grad"),
    ("inf", lambda h: _set(h, ["grad", "var"], math.inf), "grad.var"),
    ("-inf", lambda h: _set(h, ["progress"], -math.inf), "progress"),
    ("nan in bounds", lambda h: _set(h, ["local_bsz_bounds"], [math.nan, 8]), "local_bsz_bounds.0"),
    ("negative time", lambda h: _set(h, ["throughput", "beta_node"], -1e-3), "throughput.beta_node"),
    ("negative sqr", lambda h: _set(h, ["grad", "sqr"], -0.5), "grad.sqr"),
    ("negative progress", lambda h: _set(h, ["progress"], -1.0), "progress"),
    ("negative epoch", lambda h: _set(h, ["epoch"], -1), "epoch"),
    ("negative replicas", lambda h: _set(h, ["max_replicas_seen"], -2), "max_replicas_seen"),
    ("zero batch", lambda h: _set(h, ["init_batch_size"], 0), "init_batch_size"),
    ("zero local lo", lambda h: _set(h, ["local_bsz_bounds"], [0, 8]), "local_bsz_bounds.0"),
    ("missing top field", lambda h: _delete(h, ["epoch"]), "epoch"),
    ("missing nested field", lambda h: _delete(h, ["throughput", "gamma"]), "throughput.gamma"),
    ("missing grad", lambda h: _delete(h, ["grad", "var"]), "grad.var"),
    ("missing version", lambda h: _delete(h, ["version"]), "version"),
    ("extra top field", lambda h: _set(h, ["bogus"], 1), "bogus"),
    ("extra nested field", lambda h: _set(h, ["throughput", "delta"], 0.1), "throughput.delta"),
    ("extra grad field", lambda h: _set(h, ["grad", "norm"], 0.1), "grad.norm"),
    ("gamma below 1", lambda h: _set(h, ["throughput", "gamma"], 0.5), "throughput.gamma"),
    ("gamma above 10", lambda h: _set(h, ["throughput", "gamma"], 10.5), "throughput.gamma"),
    ("lo > hi", lambda h: _set(h, ["local_bsz_bounds"], [64, 32]), "local_bsz_bounds"),
    ("max below init", lambda h: _set(h, ["max_batch_size"], 64), "max_batch_size"),
    ("version 4", lambda h: _set(h, ["version"], 4), "version"),
    ("version string", lambda h: _set(h, ["version"], "1"), "version"),
    ("version true", lambda h: _set(h, ["version"], True), "version"),
    ("accumulation string", lambda h: _set(h, ["accumulation"], "yes"), "accumulation"),
    ("accumulation int", lambda h: _set(h, ["accumulation"], 1), "accumulation"),
    ("fractional batch", lambda h: _set(h, ["init_batch_size"], 32.5), "init_batch_size"),
    ("string batch", lambda h: _set(h, ["max_batch_size"], "4096"), "max_batch_size"),
    ("fractional epoch", lambda h: _set(h, ["epoch"], 1.5), "epoch"),
    ("bool as number", lambda h: _set(h, ["throughput", "alpha_grad"], True), "throughput.alpha_grad"),
    ("null number", lambda h: _set(h, ["grad", "sqr"], None), "grad.sqr"),
    ("throughput as list", lambda h: _set(h, ["throughput"], [0.1] * 7), "throughput"),
    ("grad as string", lambda h: _set(h, ["grad"], "8.9"), "grad"),
    ("bounds too long", lambda h: _set(h, ["local_bsz_bounds"], [1, 2, 3]), "local_bsz_bounds"),
    ("bounds too short", lambda h: _set(h, ["local_bsz_bounds"], [1]), "local_bsz_bounds"),
    ("bounds as object", lambda h: _set(h, ["local_bsz_bounds"], {"lo": 1}), "local_bsz_bounds"),
    ("huge integer", lambda h: _set(h, ["progress"], 10**400), "progress"),
]


@pytest.mark.parametrize(("mutate", "field"), [(m, f) for _, m, f in VIOLATIONS],
                         ids=[d for d, _, _ in VIOLATIONS])
def test_violation_is_rejected_naming_the_field(mutate, field):
    hints = copy.deepcopy(make_hints())
    mutate(hints)
    with pytest.raises(HintsError) as info:
        validate_hints(hints)
    err = info.value
    assert err.field == field
    assert str(err).startswith(f"{field}:")
    assert err.status_code == 422
    assert isinstance(err, ValueError)
    with pytest.raises(HintsError):
        hints_to_model(hints)


def test_non_finite_numbers_from_python_json_are_rejected():
    text = json.dumps(make_hints()).replace('"progress": 12345.5', '"progress": NaN')
    parsed = json.loads(text)                  # Python's json accepts NaN ...
    assert math.isnan(parsed["progress"])
    with pytest.raises(HintsError, match="progress: must be a finite number") as info:
        validate_hints(parsed)                  # ... the contract does not
    assert info.value.field == "progress"
    text = json.dumps(make_hints()).replace('"gamma": 2.23', '"gamma": Infinity')
    with pytest.raises(HintsError) as info:
        validate_hints(json.loads(text))
    assert info.value.field == "throughput.gamma"


@pytest.mark.parametrize("body", [None, [], "hints", 3])
def test_non_object_body_is_rejected(body):
    with pytest.raises(HintsError) as info:
        validate_hints(body)
    assert info.value.field == ""
    assert str(info.value).startswith("hints:")


def test_non_string_key_is_rejected():
    hints = make_hints()
    hints["throughput"][1] = 0.5
    with pytest.raises(HintsError) as info:
        validate_hints(hints)
    assert info.value.field == "throughput"


def test_build_hints_rejects_bad_parameters():
    with pytest.raises(HintsError) as info:
        make_hints(local_bsz_bounds=(64, 32))
    assert info.value.field == "local_bsz_bounds"
    with pytest.raises(HintsError) as info:
        make_hints(params={**PARAMS.to_dict(), "gamma": float("nan")})
    assert info.value.field == "throughput.gamma"
    with pytest.raises(HintsError) as info:
        make_hints(epoch=-1)
    assert info.value.field == "epoch"


def test_hints_to_model_gives_the_policy_what_it_needs():
    hints = make_hints()
    model, limits, max_seen = hints_to_model(json.loads(json.dumps(hints)))
    assert isinstance(model, GoodputModel) and isinstance(limits, BatchLimits)
    assert model.throughput_params == PARAMS
    assert model.grad_stats == GRAD
    assert model.init_batch_size == 128
    assert limits == BatchLimits(128, 4096, 32, 1024, True)
    assert max_seen == 4
    plan = model.optimize(np.array([1, 2]), np.array([4, 8]), limits)
    assert np.all(plan.goodput > 0)


def test_hints_path_quotes_the_job_id():
    assert hints_path("job-1") == "/v1/jobs/job-1/hints"
    assert hints_path("a/b c") == "/v1/jobs/a%2Fb%20c/hints"


def test_hints_module_does_not_import_torch():
    code = "import sys, pollux.hints; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


BALANCE = {"mode": "gpu", "shares": [20, 12], "step_times": [0.101, 0.098],
           "predicted_step_time": 0.1, "stragglers": [1]}


def test_balance_is_optional_and_round_trips():
    assert "balance" not in make_hints()                    # old hints stay valid, without it
    hints = make_hints(balance=BALANCE)
    assert hints["balance"] == BALANCE
    jsonschema.validate(hints, load_schema(), cls=jsonschema.Draft202012Validator)
    assert validate_hints(json.loads(json.dumps(hints))) == hints
    raw = copy.deepcopy(hints)
    raw["balance"]["shares"] = [20.0, np.int64(12)]
    raw["balance"]["step_times"] = [np.float32(0.5), 1]
    raw["balance"]["stragglers"] = []
    out = validate_hints(raw)["balance"]
    assert out["shares"] == [20, 12] and all(type(x) is int for x in out["shares"])
    assert out["step_times"] == [0.5, 1.0] and all(type(x) is float for x in out["step_times"])
    model, _, _ = hints_to_model(hints)                      # the policy's view is unchanged
    assert model.throughput_params == PARAMS


BALANCE_VIOLATIONS = [
    ("mode", lambda b: b.update(mode="auto"), "balance.mode"),
    ("mode missing", lambda b: b.pop("mode"), "balance.mode"),
    ("zero share", lambda b: b.update(shares=[20, 0]), "balance.shares.1"),
    ("fractional share", lambda b: b.update(shares=[20.5, 12]), "balance.shares.0"),
    ("no shares", lambda b: b.update(shares=[]), "balance.shares"),
    ("negative time", lambda b: b.update(step_times=[0.1, -0.1]), "balance.step_times.1"),
    ("nan time", lambda b: b.update(step_times=[math.nan, 0.1]), "balance.step_times.0"),
    ("inf predicted", lambda b: b.update(predicted_step_time=math.inf), "balance.predicted_step_time"),
    ("times length", lambda b: b.update(step_times=[0.1]), "balance.step_times"),
    ("straggler range", lambda b: b.update(stragglers=[0, 2]), "balance.stragglers.1"),
    ("negative straggler", lambda b: b.update(stragglers=[-1]), "balance.stragglers.0"),
    ("duplicate straggler", lambda b: b.update(stragglers=[1, 1]), "balance.stragglers"),
    ("extra field", lambda b: b.update(delta=5), "balance.delta"),
    ("not an object", None, "balance"),
]


@pytest.mark.parametrize(("mutate", "field"), [(m, f) for _, m, f in BALANCE_VIOLATIONS],
                         ids=[d for d, _, _ in BALANCE_VIOLATIONS])
def test_bad_balance_is_rejected_naming_the_field(mutate, field):
    hints = make_hints(balance=BALANCE)
    if mutate is None:
        hints["balance"] = [1, 2]
    else:
        mutate(hints["balance"])
    with pytest.raises(HintsError) as info:
        validate_hints(hints)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}:")


# ---------------------------------------------------------------------------------------------
# Version 2: GPU types (issue 13)
# ---------------------------------------------------------------------------------------------


def test_version_1_bodies_are_still_accepted():
    body = copy.deepcopy(make_hints())
    body["version"] = 1
    out = validate_hints(body)
    assert out["version"] == 3 and "gpu_type" not in out and "types" not in out
    assert "current" not in out
    assert hints_to_type_models(body) == ({}, {})
    body["gpu_type"] = "aws"                                  # a v2 field in a v1 body
    with pytest.raises(HintsError, match=r"gpu_type: unknown field .*schema v1"):
        validate_hints(body)


def test_gpu_types_round_trip_into_per_type_models():
    fast = {**PARAMS.to_dict(), "beta_grad": PARAMS.beta_grad / 3}
    hints = build_hints(PARAMS, GradStats(8.95, 5.07), 128, 4096, (32, 1024), True, 4, 10.0, 1,
                        gpu_type="aws", types={"dgx-ext": {"throughput": fast,
                                                           "local_bsz_bounds": [32, 2048]}})
    again = validate_hints(json.loads(json.dumps(hints)))
    assert again == hints and again["gpu_type"] == "aws" and set(again["types"]) == {"dgx-ext"}
    models, limits = hints_to_type_models(hints)
    assert set(models) == {"aws", "dgx-ext"}
    assert models["dgx-ext"].throughput_params.beta_grad == pytest.approx(PARAMS.beta_grad / 3)
    assert models["aws"].throughput_params == PARAMS and limits["dgx-ext"].max_local_bsz == 2048
    assert limits["aws"].max_local_bsz == 1024 and models["aws"].grad_stats == models["dgx-ext"].grad_stats


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda h: _set(h, ["gpu_type"], "bad type!"), "gpu_type"),
    (lambda h: _set(h, ["gpu_type"], ""), "gpu_type"),
    (lambda h: _set(h, ["types"], {"aws": {"throughput": PARAMS.to_dict()}}), "types.aws.local_bsz_bounds"),
    (lambda h: _set(h, ["types"], {"aws": {"throughput": PARAMS.to_dict(), "local_bsz_bounds": [64, 32]}}),
     "types.aws.local_bsz_bounds"),
    (lambda h: _set(h, ["types"], {"aws": {"throughput": {**PARAMS.to_dict(), "gamma": 20.0},
                                           "local_bsz_bounds": [1, 32]}}), "types.aws.throughput.gamma"),
])
def test_bad_gpu_type_fields_are_named(mutate, field):
    hints = copy.deepcopy(make_hints())
    mutate(hints)
    with pytest.raises(HintsError) as info:
        validate_hints(hints)
    assert info.value.field.startswith(field), info.value


def test_merge_keeps_earlier_type_profiles_that_new_hints_do_not_name():
    fast = {**PARAMS.to_dict(), "beta_grad": PARAMS.beta_grad / 3}
    slow = {**PARAMS.to_dict(), "beta_grad": PARAMS.beta_grad * 2}
    boot = build_hints(PARAMS, GRAD, 128, 4096, (32, 1024), True, 1, 0.0, 0, gpu_type="aws",
                       types={"dgx-ext": {"throughput": fast, "local_bsz_bounds": [32, 2048]},
                              "rtx": {"throughput": slow, "local_bsz_bounds": [32, 512]}})
    # The running job reports only what it measured itself, on aws and rtx.
    measured = {**PARAMS.to_dict(), "alpha_grad": 0.02}
    own = build_hints(PARAMS, GRAD, 128, 4096, (32, 1024), True, 2, 5.0, 1, gpu_type="rtx",
                      types={"aws": {"throughput": measured, "local_bsz_bounds": [32, 1024]}})
    merged = merge_type_profiles(validate_hints(boot), validate_hints(own))
    assert validate_hints(merged) == merged
    models, _ = hints_to_type_models(merged)
    assert set(models) == {"aws", "rtx", "dgx-ext"}                         # dgx-ext kept from before
    assert models["dgx-ext"].throughput_params.beta_grad == pytest.approx(PARAMS.beta_grad / 3)
    assert models["aws"].throughput_params.alpha_grad == pytest.approx(0.02)   # the new measurement wins
    assert models["rtx"].throughput_params == PARAMS                          # its own gpu_type wins
    assert merged["progress"] == 5.0 and merged["max_replicas_seen"] == 2
    # Nothing earlier: the new hints as they are; earlier hints without types add nothing.
    assert merge_type_profiles(None, validate_hints(own)) == validate_hints(own)
    untyped = validate_hints({**copy.deepcopy(make_hints()), "version": 1})
    assert merge_type_profiles(untyped, validate_hints(own)) == validate_hints(own)


# ---------------------------------------------------------------------------------------------
# Version 3: what the job runs now and what it measured there (issue 35)
# ---------------------------------------------------------------------------------------------

CURRENT = {"replicas": 2, "local_bsz": 96, "accum_steps": 1, "batch_size": 384, "step_time": 0.731,
           "steps": 40}


def test_current_is_optional_and_round_trips():
    assert "current" not in make_hints()
    hints = make_hints(current=CURRENT)
    assert hints["current"] == CURRENT and hints["version"] == 3
    jsonschema.validate(hints, load_schema(), cls=jsonschema.Draft202012Validator)
    assert validate_hints(json.loads(json.dumps(hints))) == hints
    untimed = {k: v for k, v in CURRENT.items() if k not in ("step_time", "steps")}
    assert make_hints(current=untimed)["current"] == untimed      # not timed yet: no step time
    raw = copy.deepcopy(hints)
    raw["current"].update(replicas=np.int64(2), local_bsz=96.0, step_time=np.float32(0.5), steps=40.0)
    out = validate_hints(raw)["current"]
    assert out == {**CURRENT, "step_time": 0.5}
    assert all(type(out[k]) is int for k in ("replicas", "local_bsz", "accum_steps", "batch_size", "steps"))
    assert type(out["step_time"]) is float
    model, limits, _ = hints_to_model(hints)                  # the policy's view is unchanged
    assert (model, limits) == hints_to_model(make_hints())[:2]


@pytest.mark.parametrize("version", [1, 2])
def test_older_versions_are_normalised_to_version_3_without_current(version):
    body = copy.deepcopy(make_hints())
    body["version"] = version
    out = validate_hints(body)
    assert out == {**make_hints(), "version": 3} and "current" not in out
    body["current"] = dict(CURRENT)                          # a v3 field in an older body
    with pytest.raises(HintsError, match=rf"current: unknown field .*schema v{version}"):
        validate_hints(body)


CURRENT_VIOLATIONS = [
    ("unknown field", lambda c: c.update(gpus=2), "current.gpus"),
    ("batch size mismatch", lambda c: c.update(batch_size=192), "current.batch_size"),
    ("accumulation ignored", lambda c: c.update(accum_steps=0), "current.batch_size"),
    ("zero step time", lambda c: c.update(step_time=0.0), "current.step_time"),
    ("negative step time", lambda c: c.update(step_time=-0.1), "current.step_time"),
    ("nan step time", lambda c: c.update(step_time=math.nan), "current.step_time"),
    ("step time without steps", lambda c: c.pop("steps"), "current.steps"),
    ("steps without step time", lambda c: c.pop("step_time"), "current.step_time"),
    ("zero steps", lambda c: c.update(steps=0), "current.steps"),
    ("zero replicas", lambda c: c.update(replicas=0), "current.replicas"),
    ("negative accumulation", lambda c: c.update(accum_steps=-1), "current.accum_steps"),
    ("fractional local batch", lambda c: c.update(local_bsz=96.5), "current.local_bsz"),
    ("missing batch size", lambda c: c.pop("batch_size"), "current.batch_size"),
]


@pytest.mark.parametrize(("mutate", "field"), [(m, f) for _, m, f in CURRENT_VIOLATIONS],
                         ids=[d for d, _, _ in CURRENT_VIOLATIONS])
def test_bad_current_is_rejected_naming_the_field(mutate, field):
    hints = make_hints(current=CURRENT)
    mutate(hints["current"])
    with pytest.raises(HintsError) as info:
        validate_hints(hints)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}:")
    with pytest.raises(HintsError):
        build_hints(PARAMS, GRAD, 128, 4096, (32, 1024), True, 4, 1.0, 3, current=hints["current"])
