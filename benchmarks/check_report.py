"""Open a `fastvocab report` page in a real headless browser and check that it renders; save a screenshot.

Not part of the test suite (a fresh CI machine has no browser). Needs Chromium and Playwright, kept out of the
project's environment:

    apt-get install -y chromium
    python3 -m venv /tmp/pw && /tmp/pw/bin/pip install playwright
    /tmp/pw/bin/python benchmarks/check_report.py --run-id latest \\
        --tracking-uri sqlite:////tmp/demo-copy/mlflow.db \\
        --html benchmarks/results/report-demo.html --screenshot benchmarks/results/report-demo.png

With ``--run-id`` the report is rendered first with this checkout's ``fastvocab report`` (``--fastvocab``);
without it, ``--html`` must exist. Playwright drives the system Chromium (``--chromium``): its own browser
download does not work here.

Checked: the page loads from a file with every request that is not ``file:`` or ``data:`` blocked and none
attempted (self-contained); no console errors; every ``<img>`` decoded (``naturalWidth > 0``) and laid out;
every table has body rows, and the tables outside collapsed blocks are laid out with a height. Prints one JSON
line with the counts; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in the page: what was rendered, from the browser's layout (not from the HTML text).
PROBE = """() => {
  const imgs = [...document.images].map(i => ({
    alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight,
    width: i.getBoundingClientRect().width, dataUri: i.src.startsWith('data:'),
    hidden: !!i.closest('details:not([open])')}));
  const tables = [...document.querySelectorAll('table')].map(t => ({
    rows: t.tBodies.length ? t.tBodies[0].rows.length : 0,
    cols: t.tHead ? t.tHead.rows[0].cells.length : 0,
    height: t.getBoundingClientRect().height,
    hidden: !!t.closest('details:not([open])')}));
  return {title: document.title, h1: (document.querySelector('h1') || {}).textContent || '',
          imgs, tables, height: document.documentElement.scrollHeight,
          scripts: document.scripts.length, stylesheets: document.querySelectorAll('link').length};
}"""


def render_report(args: argparse.Namespace) -> None:
    cmd = [str(args.fastvocab), "report", args.run_id, "-o", str(args.html)]
    if args.tracking_uri:
        cmd += ["--tracking-uri", args.tracking_uri]
    if args.work_dir:
        cmd += ["--work-dir", str(args.work_dir)]
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def check(args: argparse.Namespace) -> dict[str, object]:
    from playwright.sync_api import sync_playwright

    html = args.html.resolve()
    failures: list[str] = []
    outside: list[str] = []
    console_errors: list[str] = []

    def route(r) -> None:
        url = r.request.url
        if url.startswith(("file:", "data:")):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(args.chromium), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900}, device_scale_factor=1)
        page.route("**/*", route)
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        page.goto(html.as_uri(), wait_until="load")
        page.wait_for_function("[...document.images].every(i => i.complete)", timeout=30_000)
        probe = page.evaluate(PROBE)
        args.screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.screenshot), full_page=True, type="png")
        version = browser.version
        browser.close()

    imgs, tables = probe["imgs"], probe["tables"]
    if not probe["h1"].startswith("fastvocab report"):
        failures.append(f"no report heading (h1 {probe['h1']!r})")
    if not imgs:
        failures.append("no images")
    for i, img in enumerate(imgs):
        if not (img["complete"] and img["naturalWidth"] > 0 and img["naturalHeight"] > 0):
            failures.append(f"image {i} ({img['alt']}) did not decode")
        elif not img["hidden"] and img["width"] <= 0:
            failures.append(f"image {i} ({img['alt']}) not laid out")
        if not img["dataUri"]:
            failures.append(f"image {i} ({img['alt']}) is not embedded")
    if not tables:
        failures.append("no tables")
    for i, t in enumerate(tables):
        if t["rows"] == 0:
            failures.append(f"table {i} has no rows")
        elif not t["hidden"] and t["height"] <= 0:
            failures.append(f"table {i} not laid out")
    if outside:
        failures.append(f"requests outside the file: {outside[:5]}")
    if console_errors:
        failures.append(f"console errors: {console_errors[:5]}")
    if probe["scripts"] or probe["stylesheets"]:
        failures.append(f"{probe['scripts']} scripts, {probe['stylesheets']} <link> elements")
    return {
        "html": str(args.html),
        "html_bytes": args.html.stat().st_size,
        "screenshot": str(args.screenshot),
        "screenshot_bytes": args.screenshot.stat().st_size,
        "browser": f"chromium {version}",
        "viewport_width": args.width,
        "page_height": probe["height"],
        "images": len(imgs),
        "images_decoded": sum(i["naturalWidth"] > 0 for i in imgs),
        "tables": len(tables),
        "tables_visible": sum(not t["hidden"] for t in tables),
        "table_rows": sum(t["rows"] for t in tables),
        "failures": failures,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--html", type=Path, default=ROOT / "benchmarks/results/report-demo.html")
    p.add_argument("--screenshot", type=Path, default=ROOT / "benchmarks/results/report-demo.png")
    p.add_argument("--run-id", default=None, help="render this run's report first (or 'latest')")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--fastvocab", type=Path, default=ROOT / ".venv/bin/fastvocab")
    p.add_argument("--chromium", type=Path, default=Path("/usr/bin/chromium"))
    p.add_argument("--width", type=int, default=1280, help="viewport width of the screenshot (CSS px)")
    args = p.parse_args()
    if args.run_id:
        render_report(args)
    result = check(args)
    print(json.dumps(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
