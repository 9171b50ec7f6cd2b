"""The OpenAPI description of the service's API (:mod:`pollux.cluster.api.app`): bodies, answers, errors.

Request bodies are parsed by hand in the API (so that an error names the field, and so that limits
apply before parsing), so the framework cannot infer their schemas; they are written here as JSON
Schema (OpenAPI 3.1 uses draft 2020-12), from the same limits the validation enforces
(:mod:`pollux.cluster.state.spec`, :mod:`pollux.cluster.api.limits`, the hints contract ``hints-v3.json``).
Answers are described the same way, field for field, so that a schema-driven fuzzer can check every
real answer against them (``tests/test_cluster_openapi.py``).

:func:`responses` builds a route's ``responses=`` argument; :func:`request_body` its
``openapi_extra``; :func:`install` adds the component schemas and the bearer security scheme to the
application's generated document.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from pollux.cluster.api.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, MAX_QUERY_INT
from pollux.cluster.state import spec
from pollux.cluster.state.lifecycle import JOB_STATES
from pollux.cluster.state.user_table import USER_NAME_PATTERN
from pollux.contract import BALANCE_MODES, JOB_KINDS
from pollux.hints import load_schema as _load_hints_schema

__all__ = ["COMPONENTS", "JOB_ID_PATTERN", "install", "request_body", "responses"]

#: What a job id may be (as the store allows it); any other id is answered 404 without a look-up.
JOB_ID_PATTERN = f"^{spec.JOB_ID_PATTERN}$"

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_PATH = {"type": "string", "minLength": 1, "maxLength": spec.MAX_PATH_CHARS}
_BATCH = {"type": "integer", "minimum": 1, "maximum": spec.MAX_BATCH_SIZE}


def _job_spec(*, answer: bool) -> dict[str, Any]:
    """The job spec: as submitted (``answer`` False: only entrypoint and init_batch_size required),
    or as answered (every field present, defaults filled in)."""
    fields: dict[str, Any] = {
        "entrypoint": {**_PATH, "description": "A .py script (run by the service's Python), an "
                       "executable's path, or a command on the PATH; relative to working_dir. No "
                       "control characters."},
        "init_batch_size": {**_BATCH, "description": "The batch size the job was tuned with."},
        "args": {**_nullable({"type": "array", "maxItems": spec.MAX_ARGS,
                              "items": {"type": "string", "maxLength": spec.MAX_ARG_CHARS}}),
                 "description": f"Arguments (no NUL; at most {spec.MAX_ARGS_TOTAL_CHARS} characters "
                                "in all)."},
        "working_dir": {**_nullable({**_PATH, "pattern": "^/"}),
                        "description": "Absolute path of an existing directory the replicas run in."},
        "max_batch_size": {**_nullable(_BATCH), "description": "Largest total batch (>= "
                           "init_batch_size); null for a fixed batch."},
        "local_bsz_bounds": {**_nullable({"type": "array", "minItems": 2, "maxItems": 2,
                                          "items": _nullable(_BATCH)}),
                             "description": "[lo, hi] bounds of the per-replica batch (lo <= hi); null "
                                            "entries are unbounded."},
        "min_replicas": {**_nullable({"type": "integer", "minimum": 0, "maximum": spec.MAX_REPLICAS}),
                         "description": "Replicas the job needs at once (at most the cluster's slots "
                                        "for it)."},
        "max_replicas": {**_nullable({"type": "integer", "minimum": 1, "maximum": spec.MAX_REPLICAS}),
                         "description": "Most replicas (>= min_replicas); null for no limit."},
        "resources": {**_nullable({
            "type": "object", "maxProperties": spec.MAX_RESOURCES,
            "propertyNames": {"minLength": 1, "maxLength": spec.MAX_RESOURCE_NAME_CHARS},
            "properties": {"GPU": {"type": "integer", "minimum": 1,
                                   "maximum": spec.MAX_GPUS_PER_REPLICA}},
            "additionalProperties": {"type": "number", "minimum": spec.MIN_RESOURCE_AMOUNT,
                                     "maximum": spec.MAX_RESOURCE_AMOUNT}}),
            "description": "Ray resources per replica; GPU (a whole number, default 1) must fit on one "
                           "node, every other resource be present somewhere in that amount."},
        "preemptible": {"type": "boolean", "description": "Whether the policy may take the job's GPUs."},
        "balance": {"type": "string", "enum": list(BALANCE_MODES),
                    "description": "LB-BSP balancing of the replicas' local batches, given to them as "
                                   "POLLUX_BALANCE (unset when off). Default off."},
        "kind": {"type": "string", "enum": list(JOB_KINDS),
                 "description": "How the job follows a new allocation: restart (checkpoint, stop, "
                                "relaunch; default) or elastic (its master moves its workers in place)."},
        "env": {**_nullable({
            "type": "object", "maxProperties": spec.MAX_ENV_VARS,
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": spec.MAX_ENV_NAME_CHARS,
                              "not": {"pattern": "^(" + "|".join(spec.RESERVED_ENV_PREFIXES) + ")"}},
            "additionalProperties": {"type": "string", "maxLength": spec.MAX_ARG_CHARS}}),
            "description": "Environment variables added to every replica's (names starting with "
                           + " or ".join(spec.RESERVED_ENV_PREFIXES) + " are the service's to set)."},
    }
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": fields}
    if answer:
        # Every field present. A stored spec that no longer validates is answered as the best-effort
        # reading JobSpec.from_stored makes, which does validate (spec_error says what was wrong).
        schema["required"] = list(fields)
    else:
        schema["required"] = ["entrypoint", "init_batch_size"]
    return schema


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with its local ``#/$defs/...`` references replaced by their targets, and without
    ``$schema``/``$id``, so that it can sit inside the OpenAPI document."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return {**_inline_refs(copy.deepcopy(defs[ref.rsplit("/", 1)[1]]), defs),
                    **_inline_refs(rest, defs)}
        return {k: _inline_refs(v, defs) for k, v in schema.items()
                if k not in ("$schema", "$id", "$defs")}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def _plain_tuples(schema: Any) -> Any:
    """``schema`` with each ``prefixItems`` whose entries are all alike (and no more items) written
    as plain ``items``: the same constraint, in a form every OpenAPI tool reads."""
    if isinstance(schema, dict):
        out = {k: _plain_tuples(v) for k, v in schema.items()}
        prefix = out.get("prefixItems")
        if isinstance(prefix, list) and prefix and all(p == prefix[0] for p in prefix) and \
                out.get("items") is False and out.get("maxItems") == len(prefix):
            del out["prefixItems"]
            out["items"] = prefix[0]
        return out
    if isinstance(schema, list):
        return [_plain_tuples(v) for v in schema]
    return schema


def _hints_schema() -> dict[str, Any]:
    raw = _load_hints_schema()
    return _plain_tuples(_inline_refs(raw, raw.get("$defs", {})))


_TIME = {"type": "number", "description": "Unix time, seconds."}
_STATES = list(JOB_STATES)
_ALLOCATION = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1},
               "description": "GPUs per node."}

_JOB_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "name": {"type": "string"},
    "state": {"type": "string", "enum": _STATES},
    "spec": _ref("JobSpec"),
    "spec_error": {**_nullable({"type": "string"}), "description": "Null, or why a stored spec no "
                   "longer validates (the job is then failed; spec is a best-effort reading)."},
    "submit_time": _TIME,
    "start_time": _nullable(_TIME),
    "end_time": _nullable(_TIME),
    "restarts": {"type": "integer", "minimum": 0},
    "failures": {"type": "integer", "minimum": 0},
    "failure_reason": _nullable({"type": "string"}),
    "attained_service": {"type": "number", "minimum": 0, "description": "GPU-seconds received."},
    "allocation": _ALLOCATION,
    "gpu_types": {"type": "array", "items": {"type": "string"},
                  "description": "GPU types of the allocation's nodes, sorted; empty on an untyped cluster."},
    "owner": {**_nullable({"type": "string"}), "description": "The user who submitted the job; null "
              "for the admin's jobs."},
}

_USER_FIELDS: dict[str, Any] = {
    "name": {"type": "string", "pattern": f"^{USER_NAME_PATTERN}$"},
    "created": _TIME,
    "revoked": {**_nullable(_TIME), "description": "When the user's token was revoked; null while it works."},
}


def _object(properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    out = {"type": "object", "additionalProperties": False, "required": list(properties),
           "properties": properties}
    if description:
        out["description"] = description
    return out


#: Every schema the document names under ``components/schemas``.
COMPONENTS: dict[str, Any] = {
    "SubmitRequest": {
        "type": "object", "additionalProperties": False, "required": ["spec"],
        "description": f"Body of POST /v1/jobs (at most {MAX_BODY_BYTES} bytes, nested at most "
                       f"{MAX_JSON_DEPTH} deep; no lone surrogates or non-finite numbers anywhere).",
        "properties": {
            "name": {**_nullable({"type": "string", "minLength": 1, "maxLength": spec.MAX_NAME_CHARS,
                                  "pattern": r"\S"}),
                     "description": "Shown in listings; no control characters. Defaults to the job id."},
            "spec": _ref("JobSpecRequest"),
        },
    },
    "JobSpecRequest": _job_spec(answer=False),
    "JobSpec": _job_spec(answer=True),
    "Hints": _hints_schema(),
    "Job": _object(_JOB_FIELDS, "A job as listed (never with its token)."),
    "SubmittedJob": _object({**_JOB_FIELDS, "token": {
        "type": "string", "description": "The job's own bearer token, returned only here; it "
        "authorises nothing but PUT of this job's hints."}}, "The job just submitted, with its token."),
    "JobList": {"type": "array", "items": _ref("Job")},
    "JobDetail": _object({
        **_JOB_FIELDS,
        "allocation_history": {"type": "array", "items": _object({
            "time": _TIME, "allocation": _ALLOCATION,
            "version": {"type": "integer", "description": "The allocation's version (grows)."},
            "applied": _nullable(_TIME)})},
        "transitions": {"type": "array", "items": _object({
            "from_state": _nullable({"type": "string"}), "to_state": {"type": "string"},
            "time": _TIME, "reason": _nullable({"type": "string"})})},
        "replicas": {"type": "array", "items": _object({
            "restart": {"type": "integer"}, "rank": {"type": "integer"}, "node": {"type": "string"},
            "pid": _nullable({"type": "integer"}), "log_path": _nullable({"type": "string"}),
            "start_time": _TIME, "exit_code": _nullable({"type": "integer"}),
            "end_time": _nullable(_TIME)})},
        "hints": _nullable(_ref("Hints")),
        "node_types": {"type": "object", "additionalProperties": {"type": "string"},
                       "description": "GPU type of each typed node the job was allocated or ran on."},
        "tensorboard_dir": {**_nullable({"type": "string"}), "description": "Where the job's replicas write "
                            "TensorBoard event files (POLLUX_TENSORBOARD_DIR); null without a state folder."},
    }, "A job with its allocation history, state transitions, replicas and latest hints."),
    "HintsHistory": {"type": "array", "description": "A job's hints bodies over time, oldest first, "
                     "down-sampled to at most ?points= entries (every k-th and the newest); each as the "
                     "goodput model sees it on the allocation in force when it arrived.",
                     "items": _object({
                         "time": _TIME,
                         "gpus": {"type": "integer", "minimum": 0,
                                  "description": "GPUs of the allocation in force then."},
                         "nodes": {"type": "integer", "minimum": 0},
                         "pgns": {**_nullable({"type": "number"}),
                                  "description": "Gradient noise scale at the initial batch size."},
                         "batch_size": {**_nullable({"type": "number"}),
                                        "description": "Global batch the model chooses there (null: no GPUs, "
                                                       "or a body that no longer validates)."},
                         "local_bsz": _nullable({"type": "number"}),
                         "accum_steps": _nullable({"type": "integer"}),
                         "efficiency": _nullable({"type": "number"}),
                         "step_time": {**_nullable({"type": "number"}),
                                       "description": "Predicted seconds per optimiser step."},
                         "goodput": {**_nullable({"type": "number"}),
                                     "description": "Predicted examples per second, weighted by efficiency."},
                         "measured_step_time": {**_nullable({"type": "number"}),
                                                "description": "From the body's optional current block."},
                         "measured_batch_size": _nullable({"type": "number"}),
                         "measured_goodput": {**_nullable({"type": "number"}),
                                              "description": "Measured batch size times the model's "
                                                             "statistical efficiency there, over the "
                                                             "measured step time."},
                     })},
    "Cluster": {"type": "object", "description": "The cluster as the service sees it: nodes and GPU "
                "slots, policy, scheduling interval, rounds run (more fields may be added).",
                "additionalProperties": True,
                "properties": {"nodes": {"type": "array", "items": {"type": "object"}},
                               "total_gpus": {"type": "integer"}, "policy": {"type": "string"},
                               "interval_s": {"type": "number"}, "rounds": {"type": "integer"}}},
    "Allocation": _object({
        "version": {"type": "integer", "description": "Version of the current allocation (0: none yet)."},
        "allocation": _ALLOCATION,
        "applied": {"type": "integer", "description": "Newest version the job acknowledged (0: none)."},
        "state": {"type": "string", "description": "The job's lifecycle state."}},
        "What an elastic job's master follows: its current allocation and the version it applied."),
    "AllocationAck": _object({"version": {"type": "integer", "minimum": 1}},
                             "An elastic job's master: the allocation version now applied in place."),
    "UserRequest": _object({"name": _USER_FIELDS["name"]}, "Body of POST /v1/users: the new user's name."),
    "User": _object(_USER_FIELDS, "A user of the service (never with its token)."),
    "NewUser": _object({**_USER_FIELDS, "token": {
        "type": "string", "description": "The user's bearer token, returned only here."}},
        "The user just created, with its token."),
    "UserList": {"type": "array", "items": _ref("User")},
    "Health": _object({"status": {"type": "string", "const": "ok"}}),
    "Error": _object({"detail": {"type": "string"}}, "Every error but a validation error."),
    "FieldError": _object({"detail": {"type": "string", "description": "Starts with the field."},
                           "field": {"type": "string", "description": "Dotted path of the offending "
                                     "value (\"spec.min_replicas\", \"throughput.gamma\", \"restart\"), "
                                     "or \"body\" for the body as a whole."}},
                          "A validation error (422) or an over-large body (413)."),
}

_ERROR_TEXT = {
    401: "Missing, malformed or unknown bearer token.",
    403: "A job's token used for another job's hints or allocation.",
    404: "No such job (or, for /v1/cluster, no cluster backend).",
    409: "The job is already in a terminal state.",
    413: f"The body is over {MAX_BODY_BYTES} bytes (field \"body\").",
    422: "A body, parameter or value is invalid, or a query parameter unknown; \"field\" names it.",
}


def responses(ok: int, ok_schema: str | None, *errors: int, text: bool = False,
              ok_text: str = "OK") -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=``: the success answer (``ok_schema`` names a component; ``text`` for a
    text/plain answer) and each error status with its real body and its ``WWW-Authenticate``."""
    out: dict[int | str, dict[str, Any]] = {}
    if text:
        out[ok] = {"description": ok_text, "content": {"text/plain": {"schema": {"type": "string"}}}}
    else:
        out[ok] = {"description": ok_text,
                   "content": {"application/json": {"schema": _ref(ok_schema or "Health")}}}
    for status in errors:
        body = "FieldError" if status in (413, 422) else "Error"
        entry: dict[str, Any] = {"description": _ERROR_TEXT[status],
                                 "content": {"application/json": {"schema": _ref(body)}}}
        if status == 401:
            entry["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"},
                                                     "description": "Bearer"}}
        out[status] = entry
    return out


def request_body(component: str, description: str) -> dict[str, Any]:
    """``openapi_extra`` documenting a required JSON body of the named component schema."""
    return {"requestBody": {"required": True, "description": description,
                            "content": {"application/json": {"schema": _ref(component)}}}}


#: Security requirement of the routes that need a token.
BEARER: dict[str, Any] = {"security": [{"bearer": []}]}

#: ``restart`` and ``rank`` query parameters: whole numbers from 0 to this.
QUERY_INT_MAX = MAX_QUERY_INT


def install(app: FastAPI) -> None:
    """Replace ``app.openapi`` with one that adds :data:`COMPONENTS` and the bearer scheme, and
    drops the framework's own validation-error schemas (the API answers validation errors as
    ``FieldError``)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description,
                              routes=app.routes)
            components = doc.setdefault("components", {})
            schemas = components.setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            schemas.update(copy.deepcopy(COMPONENTS))
            for operations in doc.get("paths", {}).values():
                for operation in operations.values():
                    answer = operation.get("responses", {}).get("422", {})
                    if "HTTPValidationError" in str(answer):  # a path parameter that cannot fail
                        del operation["responses"]["422"]
            components["securitySchemes"] = {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "The admin token (state folder's admin-token), or — for PUT of a job's "
                               "hints only — that job's own token."}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
