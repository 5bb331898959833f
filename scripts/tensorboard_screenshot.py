"""Serves a run's TensorBoard logs on localhost and saves a headless-Chromium screenshot of its scalar charts.

Usage: `.venv/bin/python scripts/tensorboard_screenshot.py RUN OUT.png [--width W] [--height H]`.

TensorBoard (its Python API, `tensorboard.program`) reads RUN/logs once and serves it on a free local
port; once its HTTP API lists the scalar tags, Chromium opens the Time Series dashboard with every
top-level scalar chart pinned, unsmoothed and drawn as SVG, and writes the PNG. Then both stop.
Needs Chromium (Debian: apt-get install chromium). Exit codes: 0 done, 2 usage error (no run, no
scalars, no Chromium), 1 failure.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

# Where the settings page is served, beside TensorBoard's own paths.
SETTINGS_PATH = "/keras-tfam-screenshot-settings"
# TensorBoard's saved settings (localStorage, read when the dashboard starts): no settings pane, 3 cards a row.
SETTINGS = {"timeSeriesSettingsPaneOpened": False, "timeSeriesCardMinWidth": 360, "scalarSmoothing": 0}
SETTINGS_PAGE = (
    f"<!doctype html><script>localStorage.setItem('_tb_global_settings', {json.dumps(json.dumps(SETTINGS))});</script>"
).encode()


def with_settings_page(app):
    """TensorBoard's WSGI `app`, plus the page that stores `SETTINGS` for its origin."""

    def serve(environ, start_response):
        if environ.get("PATH_INFO") == SETTINGS_PATH:
            start_response("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(SETTINGS_PAGE)))])
            return [SETTINGS_PAGE]
        return app(environ, start_response)

    return serve


def start_tensorboard(logdir):
    """A TensorBoard server of `logdir` on a free localhost port (read once): `(server, url)`."""
    from tensorboard import program

    servers = []

    def make_server(app, flags):
        servers.append(program.WerkzeugServer(with_settings_page(app), flags))
        return servers[-1]

    board = program.TensorBoard(server_class=make_server)
    board.configure(
        argv=[None, "--logdir", logdir, "--host", "localhost", "--port", "0", "--load_fast", "false"]
        + ["--reload_interval", "0", "--reload_task", "blocking"]
    )
    url = board.launch().rstrip("/")
    return servers[0], url


def scalar_tags(url, timeout=60.0):
    """`{run: [tag, ...]}` of the server's scalars, once its HTTP API lists some (or `{}` after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10) as response:
            tags = {run: list(names) for run, names in json.load(response).items() if names}
        if tags or time.monotonic() > deadline:
            return tags
        time.sleep(0.5)


def pinned_tags(tags):
    """The charts to pin: `loss` (training and validation in one chart) first, then each run's in order.

    Grouped tags (`memory/*`, `span/*`) stay in their sections below the pinned ones.
    """
    names = ["loss"] if any("loss" in names for names in tags.values()) else []
    for run_tags in tags.values():
        names += [name for name in run_tags if "/" not in name and name not in names]
    return names


def dashboard_url(url, tags):
    cards = json.dumps([{"plugin": "scalars", "tag": tag} for tag in tags])
    query = urllib.parse.urlencode({"forceSVG": "true", "smoothing": "0", "pinnedCards": cards})
    return f"{url}/?{query}#timeseries"


def screenshot(browser, url, out, width, height):
    """Stores the settings in a fresh Chromium profile, then saves `url` as the PNG `out`."""
    with tempfile.TemporaryDirectory(prefix="tensorboard-chromium-") as profile:
        common = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
        subprocess.run(
            [*common, "--dump-dom", url.split("/?")[0] + SETTINGS_PATH], capture_output=True, check=True, timeout=120
        )
        subprocess.run(
            [*common, "--hide-scrollbars", f"--window-size={width},{height}", "--virtual-time-budget=20000"]
            + [f"--screenshot={os.path.abspath(out)}", url],
            capture_output=True,
            check=True,
            timeout=300,
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run directory of `tfam train` (its TensorBoard logs are RUN/logs)")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--width", type=int, default=1600, help="window width in pixels (default: %(default)s)")
    parser.add_argument("--height", type=int, default=1020, help="window height in pixels (default: %(default)s)")
    args = parser.parse_args(argv)
    logdir = os.path.join(args.run, "logs")
    if not os.path.isdir(logdir):
        parser.error(f"no TensorBoard logs at {logdir}")
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        parser.error("no Chromium found (Debian: apt-get install chromium)")
    server, url = start_tensorboard(logdir)
    try:
        tags = scalar_tags(url)
        if not tags:
            parser.error(f"TensorBoard lists no scalars in {logdir}")
        screenshot(browser, dashboard_url(url, pinned_tags(tags)), args.out, args.width, args.height)
    finally:
        server.shutdown()
        server.server_close()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
