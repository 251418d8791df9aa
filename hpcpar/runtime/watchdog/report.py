"""What rank 0 reports: calls as plain records, their text, and how a rank ends the job."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from .. import flight

__all__ = [
    "ENV",
    "ACTION_ENV",
    "EXIT_STATUS",
    "SLOW_WINDOW",
    "call_record",
    "plain_value",
    "describe",
    "call_text",
    "call_key",
    "most_common",
    "say",
    "indent",
    "end_job",
]

ENV = "HPCPAR_WATCHDOG"
ACTION_ENV = "HPCPAR_WATCHDOG_ACTION"
EXIT_STATUS = 4  # every rank's status when the watchdog ends a hung job
SLOW_WINDOW = 50  # collectives the live slow-rank warning looks at (with HPCPAR_TRACE)


def call_record(entry: list[Any] | None) -> dict[str, Any] | None:
    """The call ``entry`` is for (its last call, for a run), as a plain dictionary."""
    if entry is None:
        return None
    calls = entry[flight.CALLS]
    if calls is None:  # a fast-path run: the communicator's sequence says how far it got
        seq = entry[-1]._sequence - 1
    else:
        seq = entry[flight.SEQ] + calls - 1
    return {
        "comm": entry[flight.COMM],
        "seq": seq,
        "operation": entry[flight.OPERATION],
        "algorithm": entry[flight.ALGORITHM],
        "count": plain_value(entry[flight.COUNT]),
        "dtype": plain_value(entry[flight.DTYPE]),
        "root": plain_value(entry[flight.ROOT]),
        "site": flight.site_text(entry[flight.SITE]),
    }


def plain_value(value: Any) -> Any:
    """A record's value as JSON can carry it (a dtype by its name)."""
    if isinstance(value, str) and value[:1] in "<>|=":  # a dtype's code: its name
        with contextlib.suppress(TypeError):
            import numpy as np

            return np.dtype(value).name
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


def describe(call: dict[str, Any]) -> str:
    """``allreduce #57 on world (mpi, count 3, float64)``."""
    return call_text(call, f" #{call['seq']} on {call['comm']}")


def call_text(call: dict[str, Any], where: str = "") -> str:
    """``allreduce (mpi, count 3, float64)``: the call without where it was."""
    extra = [f"{call['algorithm']}"] if call.get("algorithm") else []
    if call.get("count") is not None:
        extra.append(f"count {call['count']}")
    if call.get("dtype") is not None:
        extra.append(str(plain_value(call["dtype"])))
    if call.get("root") is not None:
        extra.append(f"root/peer {call['root']}")
    return f"{call['operation']}{where}" + (f" ({', '.join(extra)})" if extra else "")


def call_key(call: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What identifies a call across ranks: communicator, sequence number, operation."""
    if call is None:
        return None
    return (call["comm"], call["seq"], call["operation"])


def most_common(keys: list[Any]) -> Any:
    """The key seen most often (None for none)."""
    if not keys:
        return None
    return max(set(keys), key=keys.count)


def say(text: str) -> None:
    """Print ``text`` to stderr, each line marked as the watchdog's."""
    sys.stderr.write("".join(f"hpcpar watchdog: {line}\n" for line in text.rstrip().split("\n")))
    sys.stderr.flush()


def indent(text: str) -> str:
    """``text``'s non-empty lines, indented for a report."""
    return "".join(f"    {line}\n" for line in text.rstrip().split("\n") if line)


def end_job() -> None:
    """End this rank with ``EXIT_STATUS``, its flight record dumped first if asked for."""
    from ..exits import mark_ended
    from ..trace import dump

    dump(final=True)  # this rank's flight record, when HPCPAR_TRACE asks for it
    mark_ended(EXIT_STATUS)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)
