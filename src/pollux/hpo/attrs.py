"""The user attributes Pollux keeps on each trial of a study, in Optuna's storage.

They are ordinary Optuna user attributes (``trial.user_attrs``), so Optuna's own tools show them
(``study.trials_dataframe()``, the dashboard) and a restarted driver finds everything it needs there:
which job runs a trial, why a trial failed, what the trial reported last.
"""

from __future__ import annotations

__all__ = ["FAILURE", "JOB", "JOB_NAME", "LAST_STEP", "LAST_VALUE", "PRUNED_AT", "REQUEUED"]

#: The id of the Pollux job that runs the trial (set by the driver right after the submission).
JOB = "pollux_job"
#: The job's name, ``<study>-t<number>``: how a driver that died between the submission and writing
#: :data:`JOB` finds the job again.
JOB_NAME = "pollux_job_name"
#: Why a FAIL trial failed: the job's failure reason, or what the driver saw.
FAILURE = "pollux_failure"
#: The value and step of the trial's last ``pollux.hpo.report``, written by the trial itself: the
#: value becomes the trial's objective when its job succeeds.
LAST_VALUE = "pollux_last_value"
LAST_STEP = "pollux_last_step"
#: The step whose intermediate value made the pruner stop the trial.
PRUNED_AT = "pollux_pruned_at_step"
#: True on a FAIL trial the driver gave up for its own reasons (Ctrl-C, a submission the service
#: refused): its parameters were queued again and it does not count towards ``--trials``.
REQUEUED = "pollux_requeued"
