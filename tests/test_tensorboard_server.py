"""What a person sees: a real TensorBoard server on a finished tiny sweep, read through its HTTP API.

Checks what the browser would show: scalars, the custom-scalars layout, the HParams experiment with the swept
settings first, and the attention-map images (PNG).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.test_sweep import ROOT, env, write_spec


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, data: bytes | None = None):
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return body if url.split("?")[0].endswith("individualImage") else json.loads(body)


# A real TensorBoard server on a sweep's logs: `make test-all` runs these, `make test` does not.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A finished 2-temperature sweep and a TensorBoard server on it; yields (base URL, sweep folder)."""
    tmp_path = tmp_path_factory.mktemp("tb")
    spec = write_spec(tmp_path, grid={"temperature": [0.1, 1.0], "top_k": [None, 2]},
                      overrides={"trainer.max_steps": 4, "trainer.val_check_interval": 4})
    done = subprocess.run([sys.executable, "-m", "study.cli", "sweep", "--config", str(spec)], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep_dir = tmp_path / "logs" / "tiny"
    binary = shutil.which("tensorboard", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("the tensorboard command is not installed beside this Python")
    port = _free_port()
    server = subprocess.Popen([binary, "--logdir", str(sweep_dir), "--host", "127.0.0.1", "--port", str(port),
                               "--reload_interval", "0", "--load_fast", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if _get(f"{base}/data/runs"):
                    break
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail("TensorBoard did not serve the sweep's runs within 90 s")
            time.sleep(0.5)
        yield base, sweep_dir
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_scalars_and_layout(tensorboard):
    base, _ = tensorboard
    tags = _get(f"{base}/data/plugin/scalars/tags")
    runs_with_loss = [run for run, run_tags in tags.items() if "train/loss" in run_tags]
    assert len(runs_with_loss) == 4, sorted(tags)
    assert any(tag.startswith("attention/entropy/layer_0") for tag in tags[runs_with_loss[0]])
    layout = _get(f"{base}/data/plugin/custom_scalars/layout")
    charts = [chart["title"] for category in layout["category"] for chart in category["chart"]]
    assert any("Jacobian" in title for title in charts)


def test_hparams_lists_swept_settings_first(tensorboard):
    base, _ = tensorboard
    experiment = _get(f"{base}/data/plugin/hparams/experiment", data=json.dumps({"experimentName": ""}).encode())
    names = [info["name"] for info in experiment["hparamInfos"]]
    assert names[0] == "attention/temperature", names
    assert experiment["hparamInfos"][0].get("differs") is True
    domain = [v for v in experiment["hparamInfos"][0]["domainDiscrete"]]
    assert domain == ["0.1", "1"]  # plain text, in numeric order (log10_T is the numeric axis)
    assert {"val/loss", "val/ppl"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}
    # top-k labelled as text ("all", not 0), and the final attention and gradient metrics as named columns
    top_k = next(info for info in experiment["hparamInfos"] if info["name"] == "attention/top_k")
    assert top_k["domainDiscrete"] == ["2", "all"]
    columns = {m["name"]["tag"]: m.get("displayName") for m in experiment["metricInfos"]}
    from study import tags

    assert all(columns[tag] for tag in (tags.val(tags.attention("entropy")), tags.LOG10[tags.val(tags.jacobian("mean"))],
                                        tags.LOG10[tags.GRAD_Q], tags.GUARD_DIVERGED))
    # every run's session row, with its top-k label
    sessions = _get(f"{base}/data/plugin/hparams/session_groups", data=json.dumps(
        {"experimentName": "", "allowedStatuses": ["STATUS_SUCCESS", "STATUS_UNKNOWN"], "colParams": [],
         "startIndex": 0, "sliceSize": 100}).encode())
    labels = sorted(s["hparams"]["attention/top_k"] for g in sessions["sessionGroups"] for s in [g])
    assert labels == ["2", "2", "all", "all"], labels


def test_run_list_holds_the_runs_only(tensorboard):
    """No events folder of the sweep's own (the HParams declaration, the probe) shows as an empty run."""
    base, sweep_dir = tensorboard
    plan = json.loads((sweep_dir / "plan.json").read_text())
    assert sorted(_get(f"{base}/data/runs")) == sorted(run["name"] for run in plan["runs"])


def test_run_level_scalars_lead_the_pages(tensorboard):
    """TensorBoard groups tags by their first component and sorts the groups (capitals first): the run-level copies
    lead, the first page first, with the same values as the tags they copy, and their log10 copies."""
    from study import tags as study_tags

    base, _ = tensorboard
    tags = _get(f"{base}/data/plugin/scalars/tags")
    run = sorted(tags)[0]
    groups = sorted({tag.split("/", 1)[0] for tag in tags[run]})
    assert groups[:3] == [study_tags.SUMMARY_GROUP, study_tags.SUMMARY_TRAIN_GROUP, study_tags.SUMMARY_VAL_GROUP], groups
    for source, copy in ((study_tags.TRAIN_LOSS, "Summary/loss"), (study_tags.VAL_PPL, "Summary_val/perplexity")):
        assert copy == study_tags.LEADING[source]
        query = urllib.parse.urlencode
        values = [_get(f"{base}/data/plugin/scalars/scalars?{query({'run': run, 'tag': tag})}") for tag in (source, copy)]
        assert [(step, value) for _, step, value in values[0]] == [(step, value) for _, step, value in values[1]]
    assert study_tags.LOG10[study_tags.GRAD_NORM] in tags[run] and study_tags.LOG10[study_tags.VAL_PPL] in tags[run]
    layout = _get(f"{base}/data/plugin/custom_scalars/layout")
    assert layout["category"][0]["title"] == "run summary"
    assert any("margin" in chart for chart in layout["category"][1]["chart"])
    assert layout["category"][-1].get("closed") is True  # per-layer charts: one line per layer and run


def test_attention_map_images(tensorboard):
    base, _ = tensorboard
    tags = _get(f"{base}/data/plugin/images/tags")
    run, run_tags = next((run, t) for run, t in tags.items() if t)
    tag = sorted(run_tags)[0]
    assert tag.startswith("attention_map/layer_")
    query = urllib.parse.urlencode({"run": run, "tag": tag, "sample": 0})
    (entry, *_) = _get(f"{base}/data/plugin/images/images?{query}")
    png = _get(f"{base}/data/plugin/images/individualImage?{entry['query']}")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
