"""The report's JSON data blocks by id."""

from __future__ import annotations

import re


def blocks(page: str) -> dict[str, str]:
    found = re.findall(r"<script type='application/json' id='(\w+)'>(.*?)</script>", page, re.S)
    return dict(found)
