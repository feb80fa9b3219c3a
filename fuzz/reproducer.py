"""Reproducers: one self-contained JSON file per failure, loadable without the fuzzer's state.

A reproducer holds the batch's tensors (exact values: bf16 and fp16 go through float32, which holds
them exactly; NaN and infinities are kept), the variant spec, the check that failed with its verdict,
the check settings (sample count, alpha, seed), the library versions, and a one-line replay command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specsample.fuzz import command
from specsample.reference.contract import SpecBatch

FORMAT = "specsample-reproducer/1"
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)
}
_TENSOR_FIELDS = (
    "target_logits",
    "draft_logits",
    "draft_token_ids",
    "cu_num_drafts",
    "temperature",
    "seed",
    "step",
    "synthetic_rates",
    "draft_slot",
)
# Fields written only when the batch has them: older reproducers replay as they were.
_OPTIONAL_TENSOR_FIELDS = ("top_k", "top_p", "min_p", "tree_parent")


def encode_tensor(tensor: torch.Tensor | None) -> dict[str, Any] | None:
    """A tensor as ``{"dtype", "shape", "data"}`` with exact values."""
    if tensor is None:
        return None
    cpu = tensor.detach().cpu()
    wide = cpu.float() if cpu.dtype in (torch.float16, torch.bfloat16) else cpu
    return {
        "dtype": str(cpu.dtype).removeprefix("torch."),
        "shape": list(cpu.shape),
        "data": wide.reshape(-1).tolist(),
    }


def decode_tensor(encoded: dict[str, Any] | None, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The tensor `encode_tensor` wrote."""
    if encoded is None:
        return None
    if encoded["dtype"] not in _DTYPES:
        raise ValueError(f"dtype is {encoded['dtype']!r}; expected one of {', '.join(_DTYPES)}")
    dtype = _DTYPES[encoded["dtype"]]
    shape, values = [int(size) for size in encoded["shape"]], encoded["data"]
    if min(shape, default=0) < 0 or math.prod(shape) != len(values):
        raise ValueError(f"shape {shape} holds {math.prod(shape)} values; its data has {len(values)}")
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return torch.tensor(values, dtype=wide).reshape(shape).to(dtype).to(device)


def encode_batch(batch: SpecBatch) -> dict[str, Any]:
    """A batch as JSON-ready data."""
    encoded: dict[str, Any] = {name: encode_tensor(getattr(batch, name)) for name in _TENSOR_FIELDS}
    encoded["method"] = batch.method
    encoded["max_num_drafts"] = batch.max_num_drafts
    encoded.update(
        {
            name: encode_tensor(getattr(batch, name))
            for name in _OPTIONAL_TENSOR_FIELDS
            if getattr(batch, name) is not None
        }
    )
    if batch.draft_filter:
        encoded["draft_filter"] = True
    return encoded


def decode_batch(encoded: dict[str, Any], device: torch.device | str = "cpu") -> SpecBatch:
    """The batch `encode_batch` wrote, on ``device``.

    Raises:
        KeyError: a required field is missing.
        ValueError: naming the field whose tensor cannot be decoded (its dtype, or a shape its data
            does not fill).
    """
    tensors: dict[str, torch.Tensor | None] = {}
    for name in (*_TENSOR_FIELDS, *_OPTIONAL_TENSOR_FIELDS):
        try:
            tensors[name] = decode_tensor(
                encoded[name] if name in _TENSOR_FIELDS else encoded.get(name), device
            )
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"batch field {name}: {error}") from error
    return SpecBatch(  # type: ignore[arg-type]
        method=encoded["method"],
        max_num_drafts=encoded.get("max_num_drafts"),
        draft_filter=encoded.get("draft_filter", False),
        **tensors,
    )


def versions() -> dict[str, str]:
    """The versions of the libraries a replay depends on."""
    import hypothesis
    import triton

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": np.__version__,
        "hypothesis": hypothesis.__version__,
    }


@dataclasses.dataclass(frozen=True)
class Reproducer:
    """A failure, replayable anywhere: the variant spec and the check that failed, the failing verdict
    (as a dict), the input batch, the settings the check ran with, and the library versions then."""

    variant: str
    check: str
    verdict: dict[str, Any]
    batch: SpecBatch
    num_samples: int
    alpha: float
    seed: int
    versions: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """The reproducer as JSON-ready data."""
        return {
            "format": FORMAT,
            "variant": self.variant,
            "check": self.check,
            "verdict": self.verdict,
            "settings": {"num_samples": self.num_samples, "alpha": self.alpha, "seed": self.seed},
            "versions": self.versions,
            "batch": encode_batch(self.batch),
        }

    def digest(self) -> str:
        """A short content hash, for the file name."""
        text = json.dumps(
            {"check": self.check, "batch": encode_batch(self.batch), "seed": self.seed}, sort_keys=True
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def save(self, directory: Path) -> Path:
        """Write ``<directory>/<variant>-<check>-<digest>.json`` and return its path."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = "".join(c if c.isalnum() else "_" for c in self.variant.rsplit(":", 1)[-1].rsplit("/", 1)[-1])
        path = directory / f"{stem}-{self.check}-{self.digest()}.json"
        data = self.to_json()
        data["replay"] = command.replay(path)
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path


class ReproducerError(ValueError):
    """A file that is not a valid reproducer (a usage error: exit code 2, never the variant's)."""


def load_reproducer(path: Path) -> Reproducer:
    """Read a reproducer file.

    Raises:
        ReproducerError: naming the file and what is wrong with it: not JSON, not an object, another
            format, a missing or mistyped field, a check the harness does not know, a tensor whose data
            does not fill its shape, or a batch that breaks the contract (`SpecBatch.validate`).
    """
    from specsample.properties.checks import CHECKS

    def bad(what: str) -> ReproducerError:
        return ReproducerError(f"path {path} is not a reproducer: {what}")

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise bad(f"cannot be read ({error})") from error
    except json.JSONDecodeError as error:
        raise bad(f"not JSON ({error})") from error
    if not isinstance(data, dict):
        raise bad(f"holds a JSON {type(data).__name__}, not an object")
    if data.get("format") != FORMAT:
        raise bad(f"format is {data.get('format')!r}; expected {FORMAT!r}")
    if data.get("check") not in CHECKS:
        raise bad(f"check is {data.get('check')!r}; known checks: {', '.join(CHECKS)}")
    try:
        settings = data["settings"]
        reproducer = Reproducer(
            variant=str(data["variant"]),
            check=data["check"],
            verdict=dict(data["verdict"]),
            batch=decode_batch(data["batch"]),
            num_samples=int(settings["num_samples"]),
            alpha=float(settings["alpha"]),
            seed=int(settings["seed"]),
            versions=dict(data["versions"]),
        )
    except KeyError as error:
        raise bad(f"field {error} is missing") from error
    except (TypeError, ValueError, RuntimeError) as error:  # a tampered shape, dtype or value
        raise bad(f"{type(error).__name__}: {error}") from error
    if reproducer.num_samples < 1 or not 0 < reproducer.alpha < 1:
        raise bad(f"settings num_samples={reproducer.num_samples}, alpha={reproducer.alpha} are out of range")
    try:
        reproducer.batch.validate()
    except ValueError as error:
        raise bad(f"its batch breaks the contract: {error}") from error
    return reproducer


def replay_verdicts(
    reproducer: Reproducer, spec: str, device: str, all_checks: bool = False
) -> list[Any] | str:
    """Run the reproducer's check (or every check) on ``spec`` with its recorded settings: the
    verdicts, or why it was skipped (its batch lies outside the variant's declared capabilities)."""
    from specsample.fuzz.spec import load_variant
    from specsample.properties.batching import on_device
    from specsample.properties.checks import CHECKS, run_checks
    from specsample.reference.contract import capabilities

    variant = load_variant(spec)
    outside = capabilities(variant).admits(reproducer.batch)
    if outside is not None:
        return f"{outside} lies outside its declared capabilities"
    return run_checks(
        variant,
        on_device(reproducer.batch, device),
        checks=tuple(CHECKS) if all_checks else (reproducer.check,),
        num_samples=reproducer.num_samples,
        alpha=reproducer.alpha,
        seed=reproducer.seed,
    )
