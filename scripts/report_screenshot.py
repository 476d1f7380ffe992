"""Open a run's report.html in headless Chromium, wait for its plots, and save a
screenshot; fails (exit 1) on any console error, page error or request that leaves the
file. Used to refresh docs/report.png from the quick start's run:

    .venv/bin/python scripts/report_screenshot.py runs/quickstart/report.html docs/report.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1500, help="of the clip, from the top")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:"))
                else errors.append(f"request left the file: {r.url}"))  # fmt: skip
        page.goto(args.report.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        plots = page.locator("div.plot").count()
        page.screenshot(path=str(args.png), full_page=False)
        browser.close()
    print(f"{args.png}: {plots} plots, {len(errors)} console errors")
    for error in errors:
        print(f"  {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
