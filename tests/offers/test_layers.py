"""Offers is the bottom layer with accounts: no offers module imports billing or clusters, at
module level or inside a function (docs/architecture.md). The track record is written by
clusters (clusters/track_record.py) into offers' own table and read from there."""

from pathlib import Path

import offers
from tests.billing.test_layers import imported_modules

OFFERS = Path(offers.__file__).parent
HIGHER = ("billing", "clusters")
# The host admin reads clusters' staff events inside a function (what went wrong on a host):
# older than this test, and left for its own fix; nothing else in offers may.
KNOWN = {OFFERS / "admin.py"}


def test_no_offers_module_imports_billing_or_clusters():
    modules = sorted(set(OFFERS.rglob("*.py")) - KNOWN)
    assert len(modules) > 10  # the walk found offers, migrations and commands included

    offending = [
        f"{path.relative_to(OFFERS.parent)}:{line} imports {name}"
        for path in modules
        for line, name in imported_modules(path)
        if name.split(".")[0] in HIGHER
    ]

    assert offending == []
