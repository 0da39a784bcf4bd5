"""scripts/final_checks.py: GNU time and pytest read back exactly, and the README's block is the record's."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("final_checks", ROOT / "scripts" / "final_checks.py")
final_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(final_checks)

GNU_TIME = """
	Command being timed: "make demo"
	User time (seconds): 1820.11
	Elapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5
	Maximum resident set size (kbytes): 3145728
	Exit status: 0
"""


def test_gnu_time_report_is_read_as_seconds_and_kib():
    assert final_checks.parse_gnu_time(GNU_TIME) == {"wall_s": 3723.5, "max_rss_kib": 3145728}
    assert final_checks.parse_gnu_time("Elapsed (wall clock) time (h:mm:ss or m:ss): 0:42.31\n"
                                       "Maximum resident set size (kbytes): 10\n")["wall_s"] == 42.3


def test_pytest_closing_line_is_read_with_every_count():
    text = "..........\n1 failed, 869 passed, 2 skipped, 34 warnings in 40.24s\n"
    assert final_checks.parse_pytest(text) == {"failed": 1, "passed": 869, "skipped": 2}
    assert final_checks.parse_pytest("no tests ran\n") is None


def test_render_names_every_step_its_time_counts_memory_and_load():
    record = {"commit": "abc1234", "date": "2026-12-04 17:00 UTC",
              "machine": {"cores": 2, "cpu": "Xeon", "memory_gib": 23.4, "python": "3.11"},
              "steps": [{"step": "demo", "rc": 0, "wall_s": 1109.0, "max_rss_kib": 3 * 2**20, "load_before": 0.1,
                         "load_after": 2.0},
                        {"step": "test", "rc": 1, "wall_s": 61.0, "max_rss_kib": 2**20, "load_before": 0.2,
                         "load_after": 1.5, "pytest": {"passed": 860, "failed": 1}}]}
    text = final_checks.render(record)
    assert "commit abc1234, 2026-12-04 17:00 UTC, on a 2-core Xeon with 23.4 GiB" in text
    assert "- `make demo` (the main job): 18 min 29 s wall; largest process 3.00 GiB resident [load 0.1 -> 2.0]" in text
    assert "1 min 1 s wall, 860 passed, 1 failed, exit code 1; largest process 1.00 GiB" in text
    json.dumps(record)


def test_readme_block_is_the_recorded_checks():
    """The README's times, memory and test counts are docs/results/checks.json's, as the script writes them."""
    assert final_checks.rewrite_readme(json.loads(final_checks.RECORD.read_text()), check=True) == 0
