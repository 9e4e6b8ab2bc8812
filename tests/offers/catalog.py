"""Building inventories for the offers tests: machine types with so many free and busy hosts."""

import itertools
import re
from decimal import Decimal
from html import unescape

from offers.models import GpuModel, Host, Location, MachineType
from tests.factories import GpuModelFactory, LocationFactory, MachineTypeFactory

_names = itertools.count()


def add_hosts(machine_type: MachineType, *, free: int, busy: int = 0) -> None:
    """`free` free hosts and `busy` in-use ones, in one bulk insert."""
    states = [Host.State.FREE] * free + [Host.State.IN_USE] * busy
    Host.objects.bulk_create(
        Host(name=f"h-{next(_names):06d}", machine_type=machine_type, state=state)
        for state in states
    )


def offer_type(
    *,
    gpu: GpuModel | None = None,
    location: str = "us-east-2",
    reporting: str = Location.CapacityReporting.COUNT,
    price: str = "2.00",
    free: int = 10,
    busy: int = 0,
    **fields: object,
) -> MachineType:
    """A self-serve machine type in `location` with its hosts."""
    loc = LocationFactory(
        code=location, name=f"Site {location}", country="US", capacity_reporting=reporting
    )
    machine_type = MachineTypeFactory(
        location=loc,
        gpu=gpu or GpuModelFactory(),
        price_per_hour=Decimal(price),
        **fields,
    )
    add_hosts(machine_type, free=free, busy=busy)
    return machine_type


def offer_rows(html: str) -> list[tuple[str, str]]:
    """(offer id, availability) for each row of the picker's table, in page order."""
    return re.findall(r'data-offer="([^"]+)" data-availability="([^"]+)"', html)


def offer_row(html: str, slug: str) -> str:
    """The HTML of one offer's row."""
    match = re.search(rf'<tr [^>]*data-offer="{re.escape(slug)}".*?</tr>', html, re.S)
    assert match, f"no row for {slug}"
    return match.group(0)


def cell(row: str, name: str) -> str:
    """The text of the cell of class `name` (`loc`, `machine`, `track`, `gpus-total`, `free`,
    `price-gpu`, `price`) in one offer's row."""
    match = re.search(rf'<td class="[^"]*\b{re.escape(name)}\b[^"]*"[^>]*>(.*?)</td>', row, re.S)
    assert match, f"no {name} cell"
    return text(match.group(1))


def text(html: str) -> str:
    """The page's text with tags dropped and whitespace collapsed, for reading sentences."""
    words = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    return unescape(re.sub(r" ([.,;:!?])", r"\1", words))
