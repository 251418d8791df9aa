"""Machine profiles: alpha-beta-gamma per level, hpcpar's software costs, library timings.

A profile is a JSON file written by ``hpcpar calibrate`` (or by hand):

    {"format": "hpcpar-profile", "version": 1, "name": "...",
     "levels": {"intra": {"alpha_s": 1e-6, "beta_s_per_byte": 2e-10},
                "inter": {"alpha_s": 2e-5, "beta_s_per_byte": 1e-9}},
     "gamma_s_per_byte": 1e-10,
     "software": {"call_s": 4e-6, "step_s": 6e-6, "library_call_s": 1e-6},
     "margin": 0.1,
     "mpi_library": {"allreduce": {"ranks": 4, "layout": "ppn:2", "table": [[8, 2.1e-6], ...]}}}

``software``: what hpcpar's Python adds to one call of its own schedules (``call_s``)
and per message round (``step_s``), and to a call that runs the MPI library's own
collective through hpcpar (``library_call_s``; ``call_s`` when absent).
``oversubscribed`` (default false): some machine of the job ran more ranks than it has
cores, so pipelined stages cannot overlap. ``margin`` (default 0.1) is how much faster
than the MPI library's own call another algorithm must be predicted before ``auto``
leaves the library: a model error of a few per cent must not cost more than the
library would. ``codecs`` (optional): seconds per float32 byte to code and decode with
each compression scheme (``{"int8": 2e-10, ...}``), for ``compression="auto"``.

Loading validates every field and never executes anything from the file.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HpcparError
from .env import RAW_ENVIRON, getenv_fast
from .settings import raw_key

__all__ = [
    "Level",
    "Profile",
    "ProfileError",
    "load_profile",
    "profile_from_json",
    "default_profile",
    "DEFAULT_CODECS",
    "parse_network",
    "active_profile",
]


class ProfileError(HpcparError):
    """A machine profile that is missing, malformed or physically impossible."""


@dataclass(frozen=True)
class Level:
    """Cost of one message at one level: ``alpha + bytes * beta`` seconds."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, messages: int, nbytes: int) -> float:
        """Seconds for ``messages`` messages carrying ``nbytes`` bytes in total."""
        return messages * self.alpha_s + nbytes * self.beta_s_per_byte


@dataclass(frozen=True)
class Profile:
    """What the cost model knows about a machine."""

    name: str
    intra: Level
    inter: Level
    gamma_s_per_byte: float
    call_s: float = 0.0
    step_s: float = 0.0
    library_call_s: float = 0.0
    mpi_library: dict[str, Any] = field(default_factory=dict)
    calibrated: bool = False
    margin: float = 0.1
    oversubscribed: bool = False
    codecs: dict[str, float] = field(default_factory=dict)

    def codec_s_per_byte(self, scheme: str) -> float:
        """Seconds per float32 byte to code and decode with ``scheme`` (measured or default)."""
        return self.codecs.get(scheme) or DEFAULT_CODECS.get(scheme, 1 / 2e9)

    def to_json(self) -> dict[str, Any]:
        """The profile as the JSON document ``load_profile`` reads."""
        return {
            "format": "hpcpar-profile",
            "version": 1,
            "name": self.name,
            "calibrated": self.calibrated,
            "levels": {
                name: {"alpha_s": level.alpha_s, "beta_s_per_byte": level.beta_s_per_byte}
                for name, level in (("intra", self.intra), ("inter", self.inter))
            },
            "gamma_s_per_byte": self.gamma_s_per_byte,
            "software": {
                "call_s": self.call_s,
                "step_s": self.step_s,
                "library_call_s": self.library_call_s,
            },
            "mpi_library": self.mpi_library,
            "margin": self.margin,
            "oversubscribed": self.oversubscribed,
            "codecs": self.codecs,
        }

    def library_time(self, collective: str, nbytes: int, ranks: int) -> float | None:
        """The measured time of the MPI library's own call, interpolated, if known here."""
        entry = self.mpi_library.get(collective)
        if not entry or entry.get("ranks") != ranks or not entry.get("table"):
            return None
        table = sorted((int(b), float(t)) for b, t in entry["table"])
        x = math.log2(max(nbytes, 1))
        points = [(math.log2(max(b, 1)), math.log2(t)) for b, t in table if t > 0]
        if x <= points[0][0]:
            return 2 ** points[0][1]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if x <= x1:
                return 2 ** (y0 + (y1 - y0) * (x - x0) / (x1 - x0 or 1))
        (x0, y0), (x1, y1) = points[-2] if len(points) > 1 else points[-1], points[-1]
        slope = (y1 - y0) / (x1 - x0 or 1)
        return 2 ** (y1 + slope * (x - x1))


# Code + decode seconds per float32 byte on one core, for profiles that did not measure them
# (hpcpar calibrate does; hpcpar bench codecs compares them with a memory copy).
DEFAULT_CODECS = {"fp16": 1 / 2.5e9, "bf16": 1 / 6e9, "int8": 1 / 5e9, "1bit": 1 / 2.5e9}


def default_profile() -> Profile:
    """An uncalibrated profile: a fast shared-memory node and a 25 GB/s, 2 us network."""
    return Profile(
        name="default (uncalibrated)",
        intra=Level(0.5e-6, 1 / 10e9),
        inter=Level(2e-6, 1 / 25e9),
        gamma_s_per_byte=1 / 5e9,
    )


_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_RATES = {
    "bit/s": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "kib/s": 2**10,
    "mib/s": 2**20,
    "gib/s": 2**30,
}


def parse_network(text: str) -> Level:
    """Parse ``"2us,25GB/s"`` (latency, bandwidth) into a Level.

    Raises:
        ProfileError: not two positive quantities with known units.
    """
    parts = [p.strip().lower() for p in text.split(",")]
    match = [re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)\s*([a-z/]+)", p) for p in parts]
    if len(parts) != 2 or not all(match):
        raise ProfileError(f"bad network {text!r}: expected latency,bandwidth such as 2us,25GB/s")
    (lat, lat_unit), (bw, bw_unit) = (m.groups() for m in match)  # type: ignore[union-attr]
    if lat_unit not in _UNITS or bw_unit not in _RATES or float(bw) <= 0:
        raise ProfileError(
            f"bad network {text!r}: latency in s/ms/us/ns, bandwidth in GB/s, MB/s, Gbit ..."
        )
    return Level(float(lat) * _UNITS[lat_unit], 1.0 / (float(bw) * _RATES[bw_unit]))


def _number(doc: Any, path: str) -> float:
    value: Any = doc
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ProfileError(f"profile: missing {path}")
        value = value[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ProfileError(f"profile: {path} must be a finite number >= 0, not {value!r}")
    return float(value)


def profile_from_json(doc: Any, name: str = "profile") -> Profile:
    """Validate a parsed profile document.

    Raises:
        ProfileError: naming the first field that is missing or wrong.
    """
    if not isinstance(doc, dict) or doc.get("format") != "hpcpar-profile":
        raise ProfileError(f'{name}: not an hpcpar profile (no "format": "hpcpar-profile")')
    if doc.get("version") != 1:
        raise ProfileError(f"{name}: unsupported profile version {doc.get('version')!r}")
    library = doc.get("mpi_library", {})
    if not isinstance(library, dict):
        raise ProfileError(f"{name}: mpi_library must be an object")
    for collective, entry in library.items():
        table = entry.get("table") if isinstance(entry, dict) else None
        # [block, bytes, pack s, datatype s(, stride)] and [block, bytes, device s, staged s]
        width = 4 if collective in ("send_methods", "device_send_methods") else 2
        widths = (4, 5) if collective == "send_methods" else (width,)
        if not isinstance(table, list) or not all(
            isinstance(row, list)
            and len(row) in widths
            and all(isinstance(v, (int, float)) for v in row)
            for row in table
        ):
            shape = (
                "[[block, bytes, seconds, seconds(, stride)], ...]"
                if collective == "send_methods"
                else "[[block, bytes, seconds, seconds], ...]"
                if width == 4
                else "[[bytes, seconds], ...]"
            )
            raise ProfileError(f"{name}: mpi_library.{collective}.table must be {shape}")
    return Profile(
        name=str(doc.get("name", name)),
        intra=Level(
            _number(doc, "levels.intra.alpha_s"), _number(doc, "levels.intra.beta_s_per_byte")
        ),
        inter=Level(
            _number(doc, "levels.inter.alpha_s"), _number(doc, "levels.inter.beta_s_per_byte")
        ),
        gamma_s_per_byte=_number(doc, "gamma_s_per_byte"),
        call_s=_number(doc, "software.call_s") if "software" in doc else 0.0,
        step_s=_number(doc, "software.step_s") if "software" in doc else 0.0,
        library_call_s=_number(doc, "software.library_call_s")
        if "library_call_s" in doc.get("software", {})
        else (_number(doc, "software.call_s") if "software" in doc else 0.0),
        mpi_library=library,
        calibrated=bool(doc.get("calibrated", False)),
        margin=_margin(doc, name),
        oversubscribed=bool(doc.get("oversubscribed", False)),
        codecs=_codecs(doc, name),
    )


def _codecs(doc: dict[str, Any], name: str) -> dict[str, float]:
    value = doc.get("codecs", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in value.items()
    ):
        raise ProfileError(f"{name}: codecs must map scheme names to seconds per byte > 0")
    return {k: float(v) for k, v in value.items()}


def _margin(doc: dict[str, Any], name: str) -> float:
    value = doc.get("margin", 0.1)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ProfileError(f"{name}: margin must be a number in [0, 1), not {value!r}")
    return float(value)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file (JSON only: nothing in it is executed)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ProfileError(f"cannot read profile {os.fspath(path)}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"profile {os.fspath(path)} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    return profile_from_json(doc, os.fspath(path))


# loaded profiles, by the environment's encoded value (bytes, where CPython keeps it) or path
_active: dict[bytes | str, Profile | None] = {}


_KEY = raw_key("HPCPAR_PROFILE")


def active_profile() -> Profile | None:
    """The profile named by ``HPCPAR_PROFILE`` (loaded once per path), or None."""
    raw = RAW_ENVIRON.get(_KEY) if RAW_ENVIRON is not None else None
    if raw is not None and raw in _active:  # the path as the environment holds it: no
        return _active[raw]  # decoding (on every send's method lookup)
    path = getenv_fast("HPCPAR_PROFILE", _KEY)
    if not path:
        return None
    key = raw if raw is not None else path
    if key not in _active:
        _active[key] = load_profile(path)
    return _active[key]
