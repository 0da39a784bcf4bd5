"""The analyses `study analyze` runs, in the order they run and appear in results.json, per_head.csv, the
figures, the TensorBoard scalars and claims.md.

To add an analysis: a module holding its algorithm and its `Analysis` record (`registration.py` says what each
field does; `dilution.py` is the smallest example), and its line here. `protocol.py` and `outputs.py` iterate over this
table and need no change; a new grid or command-line option also touches `grids.py` and `command.py`.
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
