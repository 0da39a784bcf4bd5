"""`study probe`: attention-logit gradients, the attention Jacobian and the W_q/W_k Hessian against the temperature
on a frozen model, per layer and one layer at a time, with an fp64 reference (see `study.frozen.probe.command`)."""

from study.frozen.probe.command import DEFAULT_TEMPERATURES, build_parser, load_model, main, run_probe
from study.frozen.probe.gradients import ProbeError

__all__ = ["DEFAULT_TEMPERATURES", "ProbeError", "build_parser", "load_model", "main", "run_probe"]
