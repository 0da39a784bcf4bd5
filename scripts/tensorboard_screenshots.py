"""Screenshots of a real TensorBoard in headless Chromium, for docs/figures (issue "What a person sees").

    python scripts/tensorboard_screenshots.py --logdir logs/default --out docs/figures

Starts `tensorboard --logdir LOGDIR` on a free port and Chromium headless with its DevTools port, opens each
dashboard, waits in real time until the page has drawn (TensorBoard draws its line charts in a worker, which a
`--screenshot` with a virtual time budget never shows), and writes one PNG per dashboard. Needs Debian's
`chromium` and aiohttp (a dependency of `datasets`); nothing is written outside ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from study.sweep.view import address, plan_runs, run_color_regex

# (file name, URL fragment and query after http://host:port/): the views docs/running.md shows. The Time Series
# view is the address `study tensorboard` prints (its query and fragment, from the sweep's plan: runs coloured by
# T, the other arms apart, unsmoothed), filled in by `main`.
TIMESERIES = "tensorboard_timeseries.png"
VIEWS = (
    (TIMESERIES, "#timeseries"),
    ("tensorboard_custom_scalars.png", "#custom_scalars"),
    ("tensorboard_hparams.png", "#hparams"),
    ("tensorboard_images.png", "#images"),
    ("tensorboard_text_report.png", "#text"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def capture(ws_url: str, pages: list[tuple[Path, str]], settle_s: float, width: int, height: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        counter = 0

        async def call(method: str, **params):
            nonlocal counter
            counter += 1
            await ws.send_json({"id": counter, "method": method, "params": params})
            async for message in ws:
                data = json.loads(message.data)
                if data.get("id") == counter:
                    if "error" in data:
                        raise RuntimeError(f"{method}: {data['error']}")
                    return data.get("result", {})
            raise RuntimeError(f"{method}: the browser closed the connection")

        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        for path, url in pages:
            await call("Page.navigate", url=url)
            await asyncio.sleep(settle_s)
            shot = await call("Page.captureScreenshot", format="png")
            path.write_bytes(base64.b64decode(shot["data"]))
            print(f"{path} ({url})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--settle", type=float, default=25.0, help="seconds to wait on each page before the shot")
    parser.add_argument("--size", default="1400x1000")
    args = parser.parse_args(argv)
    if not args.logdir.is_dir():
        parser.error(f"--logdir {args.logdir}: not a directory")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        parser.error("no chromium on PATH (Debian: apt install chromium)")
    width, height = (int(v) for v in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    tb_port, cdp_port = free_port(), free_port()
    tensorboard = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(args.logdir), "--port",
                                    str(tb_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    profile = tempfile.mkdtemp(prefix="tb-shots-")
    chromium = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--hide-scrollbars",
                                 f"--remote-debugging-port={cdp_port}", f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{tb_port}/data/runs", 120)
        targets = json.loads(wait_for(f"http://127.0.0.1:{cdp_port}/json", 60))
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        coloured = address(run_color_regex(plan_runs(args.logdir))).split("/", 3)[3]  # "?...#timeseries"
        pages = [(args.out / name, f"http://127.0.0.1:{tb_port}/{coloured if name == TIMESERIES else suffix}")
                 for name, suffix in VIEWS]
        asyncio.run(capture(ws_url, pages, args.settle, width, height))
    finally:
        for proc in (chromium, tensorboard):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
