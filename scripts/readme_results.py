"""Write README.md's scorecard from docs/results/main.json: ``python scripts/readme_results.py [--check]``."""

import sys
from pathlib import Path

# Run from a checkout without installing: the repository root goes first on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study.report.readme import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
