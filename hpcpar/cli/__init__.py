"""The ``hpcpar`` command line: one registry of subcommands, one entry point."""

from __future__ import annotations

from .registry import Command, commands, register

__all__ = ["Command", "commands", "register"]
