"""Composition: a request's output depends on its own inputs, seed and step only.

A few trials of every request run alone, then shuffled among as many strangers (the same requests
with rotated vocabularies and fresh seeds) under a random permutation of the draft slots; every
request must emit the same tokens, counts and logprobs both times. No statistics.
"""

from __future__ import annotations

import numpy as np

from specsample.properties.batching import concatenate, permute_slots, roll_vocab, select_requests
from specsample.properties.checks.base import (
    Check,
    Settings,
    Trials,
    Verdict,
    call_variant,
    derived_rng,
    differing_rows,
    exact_verdict,
    invariance_subject,
    trial_seeds,
)
from specsample.reference.contract import SpecBatch, Variant


class Composition(Check):
    """The same requests give the same output alone and shuffled among strangers, under permuted slots."""

    name = "composition"
    counts_trials = False
    shares_trials = False

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def verdict(
        self, variant: Variant, batch: SpecBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """No statistics: ``alpha`` and ``trials`` are unused."""
        seed = settings.seed
        subject, per_request = invariance_subject(batch, settings.num_samples, seed)
        rng = derived_rng(seed, "composition")
        strangers = roll_vocab(subject, int(rng.integers(1, max(batch.vocab_size, 2))))
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
        rows = np.arange(subject.num_requests)
        differ = differing_rows(alone, crowded, rows, place[rows])
        r = differ[0] if differ else 0
        slots = " under permuted slots" if subject.slotted else ""
        return exact_verdict(
            self.name,
            variant,
            failures=len(differ),
            total=subject.num_requests,
            passed=f"{subject.num_requests} requests give the same output alone and shuffled among "
            f"{strangers.num_requests} strangers{slots}",
            failed=f"{len(differ)} of {subject.num_requests} requests change when shuffled among strangers; "
            f"first: request {r // per_request} emits {alone.token_ids[r].tolist()} alone, "
            f"{crowded.token_ids[place[r]].tolist()} shuffled",
            request=r // per_request,
        )


CHECK = Composition()
