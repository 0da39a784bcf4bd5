"""The analyses `study analyze` runs, in the order they run and appear in results.json, per_head.csv, the
figures, the TensorBoard scalars and claims.md.

To add an analysis: a module holding its algorithm and its `Analysis` record (`registration.py` says what each
field does; `dilution.py` is the smallest example), and its line here. `protocol.py` and `outputs.py` iterate over this
registry and need no change; a new grid or command-line option also touches `grids.py` and `command.py`.
"""

from .critical import CRITICAL
from .dilution import DILUTION
from .distance import DISTANCE
from .gradient import GRADIENT
from .separability import SEPARABILITY

ANALYSES = (
    DISTANCE,  # Algorithms 1 and 2: distance between the full and the top-N context vector
    CRITICAL,  # Algorithm 3: critical N* by a KS test of d against E
    SEPARABILITY,  # Algorithm 4: geometric separability N_s/N and its bounds
    GRADIENT,  # Algorithm 5: gradient sensitivity against temperature
    DILUTION,  # Lemma 1: max weight and n * min / max weight against the visible count
)

# The names `study analyze --analyses` takes, in the registry's order.
BY_NAME = {"distance": DISTANCE, "critical": CRITICAL, "separability": SEPARABILITY, "gradient": GRADIENT,
           "dilution": DILUTION}


def check_names(names) -> list[str]:
    """The analyses named (in the registry's order), or ValueError naming the bad value and the choices."""
    names = list(names)
    if not names:
        raise ValueError(f"no analysis named; choose among {', '.join(BY_NAME)}")
    for name in names:
        if name not in BY_NAME:
            raise ValueError(f"unknown analysis {name!r}; choose among {', '.join(BY_NAME)}")
    return [name for name in BY_NAME if name in names]


def chosen(results: dict) -> tuple:
    """The analyses a results dict holds (`choices.analyses`; every analysis in results that predate the choice)."""
    names = (results.get("choices") or {}).get("analyses")
    return ANALYSES if names is None else tuple(BY_NAME[name] for name in check_names(names))
