"""Test support: every Plan a test builds goes through :func:`horotopo.validate.validate`."""
from typing import Optional

from horotopo.plan import Plan
from horotopo.topology import Topology
from horotopo.validate import validate


def checked(plan: Plan, topology: Optional[Topology] = None) -> Plan:
    """Return ``plan`` after checking every invariant of it and of its step tables (capacity
    too when ``topology`` is given); a broken one raises ``InvariantError``."""
    validate(plan, topology)
    return plan
