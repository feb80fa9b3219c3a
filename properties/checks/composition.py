"""Composition: a request's output depends on its own inputs, seed and step only.

A few trials of every request run alone, then shuffled among as many strangers (the same requests
with rotated vocabularies and fresh seeds) under a random permutation of the draft slots; every
request must emit the same tokens, counts and logprobs both times. No statistics.
"""

from __future__ import annotations

import numpy as np

from specsample.properties.batching import concatenate, permute_slots, roll_vocab, select_requests
from specsample.properties.checks.base import (
    I64Array,
    InvarianceCheck,
    call_variant,
    derived_rng,
    trial_seeds,
)
from specsample.reference.contract import SpecBatch, SpecOutput, Variant


class Composition(InvarianceCheck):
    """The same requests give the same output alone and shuffled among strangers, under permuted slots."""

    name = "composition"
    change = "when shuffled among strangers"
    shown = "{} alone, {} shuffled"

    def outputs(
        self, variant: Variant, subject: SpecBatch, seed: int
    ) -> tuple[SpecOutput, SpecOutput, I64Array, str]:
        """``subject`` alone, then shuffled among strangers."""
        rng = derived_rng(seed, "composition")
        strangers = roll_vocab(subject, int(rng.integers(1, max(subject.vocab_size, 2))))
        strangers = select_requests(
            strangers,
            rng.permutation(subject.num_requests),
            seed=trial_seeds(seed, "strangers", subject.num_requests),
        )
        together = concatenate([subject, strangers])
        order = rng.permutation(together.num_requests)
        # A stranger leads the crowded batch, so a variant reading batch-level state from request 0 shows.
        lead = int(np.argmax(order >= subject.num_requests))
        order[[0, lead]] = order[[lead, 0]]
        shuffled = select_requests(together, order)
        if shuffled.slotted:
            assert shuffled.draft_logits is not None
            shuffled = permute_slots(shuffled, rng.permutation(shuffled.draft_logits.shape[0]))
        alone, _ = call_variant(variant, subject, self.max_elements)
        crowded, _ = call_variant(variant, shuffled, self.max_elements)
        place = np.empty(order.size, dtype=np.int64)
        place[order] = np.arange(order.size)
        slots = " under permuted slots" if subject.slotted else ""
        same = f"alone and shuffled among {strangers.num_requests} strangers{slots}"
        return alone, crowded, place[: subject.num_requests], same


CHECK = Composition()
