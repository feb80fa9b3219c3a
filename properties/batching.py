"""Rearranging the requests of a `SpecBatch` on its device: repeated trials and composed batches.

The checks need the same request many times with fresh seeds (one variant call, many independent
samples), the requests of a batch in another order among strangers, and slotted draft logits under
another slot permutation. Every helper gathers rows with tensor indexing on the batch's device and
never changes a logit: each request keeps its rows, drafts, temperature and step bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from specsample.reference.contract import SpecBatch, SpecOutput
from specsample.reference.filters import FILTER_OFF, FILTERS

I64Array = npt.NDArray[np.int64]


def draft_counts(batch: SpecBatch) -> I64Array:
    """``[B]`` the per-request draft counts ``n_b``."""
    cu = batch.cu_num_drafts.detach().cpu().numpy().astype(np.int64)
    return np.asarray(cu[1:] - cu[:-1], dtype=np.int64)


def ranges(starts: I64Array, lengths: I64Array) -> I64Array:
    """The concatenation of ``arange(start, start + length)`` over the pairs, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.asarray(np.repeat(starts, lengths) + np.arange(total) - offsets, dtype=np.int64)


def select_requests(
    batch: SpecBatch,
    indices: Sequence[int] | I64Array,
    *,
    seed: Sequence[int] | I64Array | None = None,
    step: Sequence[int] | I64Array | None = None,
    draft_token_ids: torch.Tensor | None = None,
) -> SpecBatch:
    """A batch holding request ``indices[j]`` of ``batch`` as its request ``j`` (repeats allowed).

    ``seed`` and ``step`` (one per new request) and ``draft_token_ids`` (``[D']``, in the new order)
    replace the source requests' own. Slotted draft logits are shared, not copied: request ``j``
    reads the slot of its source request.
    """
    index = np.asarray(indices, dtype=np.int64).reshape(-1)
    device = batch.device
    cu = batch.cu_num_drafts.detach().cpu().numpy().astype(np.int64)
    new_counts = (cu[1:] - cu[:-1])[index]
    new_cu = np.concatenate([[0], np.cumsum(new_counts)])
    target_rows = ranges(cu[index] + index, new_counts + 1)
    draft_rows = ranges(cu[index], new_counts)

    def gather(tensor: torch.Tensor, rows: I64Array) -> torch.Tensor:
        return tensor.index_select(0, torch.as_tensor(rows, device=tensor.device))

    draft_logits = batch.draft_logits
    draft_slot = batch.draft_slot
    if draft_logits is not None and not batch.slotted:
        draft_logits = gather(draft_logits, draft_rows)
    if draft_slot is not None:
        draft_slot = gather(draft_slot, index)
    ids = gather(batch.draft_token_ids, draft_rows) if draft_token_ids is None else draft_token_ids.to(device)
    # A tree's parents are indices within its request: they travel with its drafts unchanged.
    parents = None if batch.tree_parent is None else gather(batch.tree_parent, draft_rows)
    if ids.shape[0] != int(new_cu[-1]):
        raise ValueError(f"draft_token_ids has {ids.shape[0]} entries; expected {int(new_cu[-1])}")

    def per_request(values: Sequence[int] | I64Array | None, source: torch.Tensor) -> torch.Tensor:
        if values is None:
            return gather(source, index)
        array = np.asarray(values, dtype=np.int64).reshape(-1)
        if array.shape[0] != index.shape[0]:
            raise ValueError(
                f"got {array.shape[0]} seeds or steps; expected one per request ({index.shape[0]})"
            )
        return torch.as_tensor(array, dtype=torch.int64, device=device)

    return dataclasses.replace(
        batch,
        target_logits=gather(batch.target_logits, target_rows),
        draft_logits=draft_logits,
        draft_token_ids=ids,
        cu_num_drafts=torch.as_tensor(new_cu, dtype=torch.int32, device=device),
        temperature=gather(batch.temperature, index),
        seed=per_request(seed, batch.seed),
        step=per_request(step, batch.step),
        draft_slot=draft_slot,
        max_num_drafts=int(new_counts.max()) if new_counts.size else 0,
        tree_parent=parents,
        **{
            name: None if getattr(batch, name) is None else gather(getattr(batch, name), index)
            for name in FILTERS
        },
    )


def concatenate(batches: Sequence[SpecBatch]) -> SpecBatch:
    """The requests of ``batches`` one after another; slotted draft buffers are stacked, slots shifted.

    The batches share the vocabulary, method, dtype, kind of draft logits and synthetic rates.
    """
    first = batches[0]
    for other in batches[1:]:
        if other.vocab_size != first.vocab_size or other.method != first.method:
            raise ValueError("batches differ in vocab size or method; expected one of each")
        if (other.draft_logits is None) != (first.draft_logits is None) or other.slotted != first.slotted:
            raise ValueError("batches differ in their kind of draft logits; expected one kind")
        if other.draft_filter != first.draft_filter:
            raise ValueError("batches differ in draft_filter; expected one value")
    cu_parts, offset = [first.cu_num_drafts.new_zeros(1)], 0
    for b in batches:
        cu_parts.append(b.cu_num_drafts[1:] + offset)
        offset += int(b.cu_num_drafts[-1])
    draft_logits, draft_slot = None, None
    if first.slotted:
        assert all(b.draft_logits is not None and b.draft_slot is not None for b in batches)
        capacity = max(int(b.draft_logits.shape[1]) for b in batches)  # type: ignore[union-attr]
        buffers, slots, base = [], [], 0
        for b in batches:
            assert b.draft_logits is not None and b.draft_slot is not None
            pad = capacity - b.draft_logits.shape[1]
            buffers.append(torch.nn.functional.pad(b.draft_logits, (0, 0, 0, pad)))
            slots.append(b.draft_slot.to(torch.int64) + base)
            base += b.draft_logits.shape[0]
        draft_logits, draft_slot = torch.cat(buffers), torch.cat(slots)
    elif first.draft_logits is not None:
        draft_logits = torch.cat([b.draft_logits for b in batches])  # type: ignore[misc]
    return dataclasses.replace(
        first,
        target_logits=torch.cat([b.target_logits for b in batches]),
        draft_logits=draft_logits,
        draft_token_ids=torch.cat([b.draft_token_ids for b in batches]),
        cu_num_drafts=torch.cat(cu_parts),
        temperature=torch.cat([b.temperature for b in batches]),
        seed=torch.cat([b.seed for b in batches]),
        step=torch.cat([b.step for b in batches]),
        draft_slot=draft_slot,
        max_num_drafts=max(b.resolved_max_num_drafts() for b in batches),
        tree_parent=None
        if first.tree_parent is None
        else torch.cat([b.tree_parent for b in batches if b.tree_parent is not None]),
        **{name: _joined_parameter(batches, name) for name in FILTERS},
    )


def _joined_parameter(batches: Sequence[SpecBatch], name: str) -> torch.Tensor | None:
    """Sampling parameter ``name`` of the batches one after another (``None`` where none has it; a
    batch without it contributes its "off" value)."""
    if all(getattr(b, name) is None for b in batches):
        return None
    off = FILTER_OFF[name]
    given = next(getattr(b, name) for b in batches if getattr(b, name) is not None)
    return torch.cat(
        [
            getattr(b, name)
            if getattr(b, name) is not None
            else torch.full_like(b.temperature, off, dtype=given.dtype)
            for b in batches
        ]
    )


def permute_slots(batch: SpecBatch, permutation: Sequence[int] | I64Array) -> SpecBatch:
    """Move slot ``s`` of a slotted batch to slot ``permutation[s]``; every request follows its slot."""
    if not batch.slotted:
        return batch
    assert batch.draft_logits is not None and batch.draft_slot is not None
    perm = torch.as_tensor(np.asarray(permutation, dtype=np.int64), device=batch.device)
    moved = torch.empty_like(batch.draft_logits)
    moved[perm] = batch.draft_logits
    return dataclasses.replace(batch, draft_logits=moved, draft_slot=perm[batch.draft_slot.to(torch.int64)])


def roll_vocab(batch: SpecBatch, shift: int) -> SpecBatch:
    """The same requests with every logit row and real draft id rotated by ``shift`` tokens.

    A stranger for composition tests: same shapes and values, other likely tokens.
    """
    vocab_size = batch.vocab_size
    ids = batch.draft_token_ids
    real = (ids >= 0) & (ids < vocab_size)
    rolled = torch.where(real, (ids + shift) % vocab_size, ids)
    draft = None if batch.draft_logits is None else torch.roll(batch.draft_logits, shift, dims=-1)
    return dataclasses.replace(
        batch,
        target_logits=torch.roll(batch.target_logits, shift, dims=-1),
        draft_logits=draft,
        draft_token_ids=rolled,
    )


def pad_output(outputs: Sequence[SpecOutput], width: int) -> SpecOutput:
    """Stack per-chunk outputs on the CPU, padding rows to ``width`` with ``-1`` (and NaN; accepted
    nodes to ``width - 1``)."""
    token_ids, logprobs, emitted, nodes = [], [], [], []
    has_logprobs = all(o.logprobs is not None for o in outputs)
    has_nodes = all(o.accepted_nodes is not None for o in outputs)
    for o in outputs:
        tokens = o.token_ids.detach().cpu()
        pad = width - tokens.shape[1]
        token_ids.append(torch.nn.functional.pad(tokens, (0, pad), value=-1))
        emitted.append(o.num_emitted.detach().cpu())
        if has_logprobs:
            assert o.logprobs is not None
            logprobs.append(torch.nn.functional.pad(o.logprobs.detach().cpu(), (0, pad), value=float("nan")))
        if has_nodes:
            assert o.accepted_nodes is not None
            accepted = o.accepted_nodes.detach().cpu()
            nodes.append(torch.nn.functional.pad(accepted, (0, width - 1 - accepted.shape[1]), value=-1))
    return SpecOutput(
        token_ids=torch.cat(token_ids),
        num_emitted=torch.cat(emitted),
        logprobs=torch.cat(logprobs) if has_logprobs else None,
        accepted_nodes=torch.cat(nodes) if has_nodes else None,
    )


def on_device(batch: SpecBatch, device: str) -> SpecBatch:
    """``batch`` with every tensor on ``device``."""
    if str(batch.device) == device:
        return batch
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    return SpecBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()})
