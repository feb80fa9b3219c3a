"""Steps: with its seed fixed, a request's outputs over distinct steps follow the exact law.

The contract keys a request's randomness by ``(seed, step)``: a serving engine keeps one seed per
request and advances the step every decoding step, so outputs at different steps of one seed must
be independent draws. The other checks vary the seed and keep the step; a sampler that ignores the
step (or mixes it in too weakly) passes them and repeats itself every step in production. This
check keeps each request's seed, gives each trial a distinct step, and runs the tests of the law of
``y`` (`properties.checks.law_of_y`: the joint law of ``(m, y)`` among them) on those trials,
combined by Holm at level ``alpha``. ``detectable``: the total variation on the joint law of
``(m, y)`` detected with power 0.999, as for the law of ``y``; a failure shows the law of ``y``'s
cells and deviation.
"""

from __future__ import annotations

from specsample.properties.checks import law_of_y
from specsample.properties.checks.base import (
    CheckedBatch,
    Component,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
    draw_trials,
)
from specsample.reference.contract import Variant


class Steps(StatisticalCheck):
    """Outputs over distinct steps of one seed follow the exact law (the module docstring says how)."""

    name = "steps"
    shares_trials = False
    varies = "the request's own seed, each trial at a distinct step"

    def draw(self, variant: Variant, checked: CheckedBatch, settings: Settings) -> Trials:
        """Each request's own seed, a distinct step per trial."""
        return draw_trials(
            variant, checked.batch, settings.num_samples, settings.seed, purpose="steps", vary="step"
        )

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests of the law of y (and of the joint law of (m, y)) on the trials over steps."""
        return law_of_y.components(checked, trials, settings.alpha)


CHECK = Steps()
