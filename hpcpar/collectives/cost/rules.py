"""A rules file: fixed algorithm choices that override the cost model (``HPCPAR_RULES``).

    {"format": "hpcpar-rules", "version": 1,
     "allreduce": [{"max_bytes": 65536, "algorithm": "recursive_doubling"},
                   {"min_ranks": 64, "algorithm": "two_level"},
                   {"algorithm": "ring"}],
     "bcast": [{"algorithm": "binomial"}]}

For a call, the first rule of its collective whose bounds all hold (``min_bytes``,
``max_bytes``, ``min_ranks``, ``max_ranks``, ``min_nodes``, ``max_nodes``; inclusive) names
the algorithm; a collective without a matching rule falls through to the model. Like
MPICH's and Open MPI's JSON tuning files, but checked on load: unknown collectives,
algorithms or keys are errors, and nothing in the file is executed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import HpcparError
from ...runtime.env import getenv_fast
from ...runtime.settings import raw_key
from ..algorithms import ALGORITHMS

__all__ = ["Rule", "RulesError", "load_rules", "rules_from_json", "active_rules", "match_rule"]

_BOUNDS = ("min_bytes", "max_bytes", "min_ranks", "max_ranks", "min_nodes", "max_nodes")


class RulesError(HpcparError):
    """A rules file that is missing, malformed or names something unknown."""


@dataclass(frozen=True)
class Rule:
    """One rule: bounds on the call, and the algorithm when they hold."""

    algorithm: str
    bounds: tuple[tuple[str, int], ...] = ()

    def matches(self, nbytes: int, ranks: int, nodes: int) -> bool:
        """Whether every bound holds for this call."""
        value = {"bytes": nbytes, "ranks": ranks, "nodes": nodes}
        for key, limit in self.bounds:
            side, what = key.split("_", 1)
            if (side == "min" and value[what] < limit) or (side == "max" and value[what] > limit):
                return False
        return True


def _rule(where: str, collective: str, rule: Any) -> Rule:
    if not isinstance(rule, dict) or "algorithm" not in rule:
        raise RulesError(f"{where} must be an object with an algorithm")
    if rule["algorithm"] not in ALGORITHMS[collective]:
        valid = ", ".join(ALGORITHMS[collective])
        raise RulesError(f"{where}: unknown algorithm {rule['algorithm']!r} (valid: {valid})")
    extra = set(rule) - {"algorithm", *_BOUNDS}
    if extra:
        raise RulesError(f"{where}: unknown key(s) {sorted(extra)}")
    bounds = []
    for key in _BOUNDS:
        if key in rule:
            value = rule[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RulesError(f"{where}: {key} must be an integer >= 0, not {value!r}")
            bounds.append((key, value))
    return Rule(rule["algorithm"], tuple(bounds))


def rules_from_json(doc: Any, name: str = "rules") -> dict[str, list[Rule]]:
    """Validate a parsed rules document.

    Raises:
        RulesError: naming the first thing that is wrong.
    """
    if not isinstance(doc, dict) or doc.get("format") != "hpcpar-rules":
        raise RulesError(f'{name}: not an hpcpar rules file (no "format": "hpcpar-rules")')
    if doc.get("version") != 1:
        raise RulesError(f"{name}: unsupported rules version {doc.get('version')!r}")
    out: dict[str, list[Rule]] = {}
    for collective, rules in doc.items():
        if collective in ("format", "version"):
            continue
        if collective not in ALGORITHMS:
            raise RulesError(f"{name}: unknown collective {collective!r}")
        if not isinstance(rules, list):
            raise RulesError(f"{name}: {collective} must be a list of rules")
        parsed = [
            _rule(f"{name}: {collective}[{i}]", collective, rule) for i, rule in enumerate(rules)
        ]
        out[collective] = parsed
    return out


def load_rules(path: str | os.PathLike[str]) -> dict[str, list[Rule]]:
    """Read and validate a rules file (JSON only)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RulesError(f"cannot read rules file {os.fspath(path)}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise RulesError(
            f"rules file {os.fspath(path)} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    return rules_from_json(doc, os.fspath(path))


_loaded: dict[str, dict[str, list[Rule]]] = {}


_KEY = raw_key("HPCPAR_RULES")


def active_rules() -> dict[str, list[Rule]] | None:
    """The rules named by ``HPCPAR_RULES`` (loaded once per path), or None."""
    path = getenv_fast("HPCPAR_RULES", _KEY)
    if not path:
        return None
    if path not in _loaded:
        _loaded[path] = load_rules(path)
    return _loaded[path]


def match_rule(
    rules: dict[str, list[Rule]], collective: str, nbytes: int, ranks: int, nodes: int
) -> str | None:
    """The algorithm the first matching rule names, or None."""
    for rule in rules.get(collective, []):
        if rule.matches(nbytes, ranks, nodes):
            return rule.algorithm
    return None
