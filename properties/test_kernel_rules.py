"""The kernels' rules and record layouts are written once: both launch plans call `kernels.rules`."""

from __future__ import annotations

import ast
import inspect
import re
from types import ModuleType

import pytest

from specsample.kernels import records, rejection, rejection_kernels, rows_kernels, rules
from specsample.reference.methods import METHODS

# The rules both plans must reach: the decisions, the final row's mode, the residual, block
# verification's weights and keep probabilities, the logprob and the scheme's draw.
RULES = (
    "accept_uniform",
    "accepts",
    "residual_weight",
    "block_log_ratio",
    "block_next_log_weight",
    "block_keep_probability",
    "block_residual",
    "log_prob",
    "law_weights",
    "block_mass",
    "block_keys",
    "block_uniform",
    "pick_block",
    "gumbel_noise",
    "gumbel_max",
    "synthetic_accepts",
    "final_mode",
    "tree_child",
)
PLANS = {
    "split": (
        rejection_kernels,
        ("row_stats_kernel", "block_keep_kernel", "sample_kernel", "emit_kernel", "tree_walk_kernel"),
    ),
    "rows": (rows_kernels, ("rows_kernel",)),
}


def _calls(module: ModuleType) -> dict[str, set[str]]:
    """The names each top-level function of ``module`` calls."""
    tree = ast.parse(inspect.getsource(module))
    calls = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            called = (call.func for call in ast.walk(node) if isinstance(call, ast.Call))
            calls[node.name] = {function.id for function in called if isinstance(function, ast.Name)}
    return calls


def _reachable(entries: tuple[str, ...], graph: dict[str, set[str]]) -> set[str]:
    seen, stack = set(), list(entries)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(graph.get(name, ()))
    return seen


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_each_plan_reaches_every_rule(plan: str) -> None:
    """Every launch plan computes each rule through `kernels.rules`, so no plan can drift from the other."""
    module, entries = PLANS[plan]
    graph = {**_calls(rules), **_calls(module)}
    missing = [rule for rule in RULES if rule not in _reachable(entries, graph)]
    assert not missing, f"the {plan} plan does not reach {missing}"
    assert all(hasattr(rules, rule) for rule in RULES)


def test_random_numbers_are_drawn_in_the_rules_only() -> None:
    """Only `kernels.rules` calls Philox (`tl.rand`, `tl.randint`), and the acceptance comparison
    (``log u + log q``) is written there once."""
    for module in (rejection_kernels, rows_kernels):
        assert not re.search(r"tl\.rand(int)?\(", inspect.getsource(module)), module.__name__
    assert len(re.findall(r"tl\.log\(u\) \+ log_q", inspect.getsource(rules))) == 1


@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_method_codes_are_the_specification_s(method: str) -> None:
    """The kernels' ``METHOD`` code of a method is the one `reference.methods` gives it."""
    assert getattr(rules, method.upper()).value == METHODS[method].kernel_code


def test_every_record_pointer_is_a_kernel_parameter() -> None:
    """Each workspace record passed as a pointer is a parameter of some split-plan kernel, and each
    geometry field names a count or a workspace record."""
    parameters = {
        name for entry in PLANS["split"][1] for name in getattr(rejection_kernels, entry).arg_names
    }  # fmt: skip
    assert set(rejection.RECORD_BUFFERS) <= parameters
    counts = {"num_target_rows", "num_draft_ids", "num_draft_rows", "slot_capacity", "num_rates"}
    counts |= {"num_requests", "max_num_drafts", "vocab_size"}
    assert set(records.GEOMETRY.FIELDS) - counts <= {work.name for work in records.WORKSPACE}
