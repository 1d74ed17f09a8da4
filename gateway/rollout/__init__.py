"""The rollout clock and the date-flag engine: which phase of each dated behaviour applies, per tenant, when.

``clock`` (what "now" is), ``behaviour`` (what a policy declares), ``config`` (the config sections, schema only),
``plan`` (the engine), ``checks`` (config checks against the declared behaviours), ``report`` (the plan explained).
"""

from .behaviour import Base, Behaviour, DateFlag
from .checks import rollout_problems
from .clock import Clock, FixedClock, SystemClock, clock_from_config, parse_instant
from .config import Brownout, Exemption, HeaderMatch, RolloutConfig, TenantRollout
from .plan import Client, Explained, HeaderClient, RolloutPlan, Schedule, effective_date
from .report import describe, describe_client, report

__all__ = (
    "Base",
    "Behaviour",
    "Brownout",
    "Clock",
    "DateFlag",
    "Client",
    "Explained",
    "Exemption",
    "FixedClock",
    "HeaderClient",
    "HeaderMatch",
    "RolloutConfig",
    "RolloutPlan",
    "Schedule",
    "SystemClock",
    "TenantRollout",
    "clock_from_config",
    "describe",
    "describe_client",
    "effective_date",
    "parse_instant",
    "report",
    "rollout_problems",
)
