"""Seeds for the from-scratch findings from a pooled page's measurements:
``python scripts/power_plan.py docs/results/scratch-pooled/pooled.json --family 8 --looks 5 --seeds 16``."""

import sys
from pathlib import Path

# Run from a checkout without installing: the repository root goes first on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study.report.power import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
