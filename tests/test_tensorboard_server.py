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


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A finished 2-temperature sweep and a TensorBoard server on it; yields (base URL, sweep folder)."""
    tmp_path = tmp_path_factory.mktemp("tb")
    spec = write_spec(tmp_path, grid={"temperature": [0.1, 1.0], "top_k": [None]},
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
    assert len(runs_with_loss) == 2, sorted(tags)
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
    assert sorted(domain) == [0.1, 1.0]
    assert {"val/loss", "val/ppl"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}


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
