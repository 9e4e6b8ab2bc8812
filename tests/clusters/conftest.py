"""Fixtures of the lifecycle tests: a project with credit and keys, the simulated data center,
and a frozen clock at T0 that a test moves (`clock.move_to(at(seconds))`)."""

import pytest
import time_machine

from tests.clusters.lab_kit import (  # noqa: F401 - lab fixtures
    dashboard,
    fleet,
    lab,
    lab_run,
    user_key,
)
from tests.clusters.lifecycle_kit import T0, Sim, new_project


@pytest.fixture
def project(db):
    return new_project()[1]


@pytest.fixture
def person(db):
    """A user and their project, with credit and keys: (user, project)."""
    return new_project()


@pytest.fixture
def sim():
    """The simulated data center, its work run in this process (lifecycle_kit.Sim)."""
    with Sim() as running:
        yield running


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller
