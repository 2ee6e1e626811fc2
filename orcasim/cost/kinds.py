"""The cost kinds' configurations as one union: a scenario's `cost:` block, discriminated
by `kind`. Apart from the factory (`orcasim.cost`) so that a calibrated cost file, which
holds a whole block of any kind, is read by a module below the factory
(`orcasim.cost.calibrated`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orcasim.cost.fitted import FittedCostConfig
from orcasim.cost.linear import LinearCostConfig
from orcasim.cost.profile import ProfileCostConfig
from orcasim.cost.roofline import RooflineCostConfig

CostConfig = Annotated[
    LinearCostConfig | RooflineCostConfig | ProfileCostConfig
    | FittedCostConfig,
    Field(discriminator="kind"),
]
