"""Games as walkable states: built-in Kuhn and Leduc poker, and any OpenSpiel game.

A state offers ``is_terminal()``, ``is_chance()``, ``chance_outcomes()`` (action,
probability pairs), ``legal_actions()``, ``current_player()``, ``child(action)``,
``info_key(player)`` (equal exactly for the histories a player cannot tell apart) and
``returns0()`` (player 0's payoff; player 1 gets its negative). The built-in games follow
OpenSpiel's kuhn_poker and leduc_poker rules, action numbers, chance order and payoffs,
so they compile to the same trees (tested against OpenSpiel).
"""

# ruff: noqa: D102 - the state interface is documented once, in the module docstring

from __future__ import annotations

import re
from typing import Any

from hpcpar.errors import HpcparError

__all__ = ["CfrError", "BUILTIN_GAMES", "root_state", "KuhnState", "LeducState"]


class CfrError(HpcparError):
    """A game, tree file or solver parameter the CFR app cannot use."""


class KuhnState:
    """Kuhn poker: cards 0-2, ante 1, actions 0 = pass, 1 = bet."""

    def __init__(self, cards: tuple[int, ...] = (), history: tuple[int, ...] = ()) -> None:
        self.cards, self.history = cards, history

    def is_chance(self) -> bool:
        return len(self.cards) < 2

    def is_terminal(self) -> bool:
        return self.history in ((0, 0), (0, 1, 0), (0, 1, 1), (1, 0), (1, 1))

    def chance_outcomes(self) -> list[tuple[int, float]]:
        left = [c for c in range(3) if c not in self.cards]
        return [(c, 1.0 / len(left)) for c in left]

    def legal_actions(self) -> list[int]:
        return [0, 1]

    def current_player(self) -> int:
        return len(self.history) % 2

    def child(self, action: int) -> KuhnState:
        if self.is_chance():
            return KuhnState((*self.cards, action), self.history)
        return KuhnState(self.cards, (*self.history, action))

    def info_key(self, player: int) -> str:
        return f"{self.cards[player]}:{''.join(map(str, self.history))}"

    def returns0(self) -> float:
        win = 1.0 if self.cards[0] > self.cards[1] else -1.0
        h = self.history
        if h == (0, 0):
            return win
        if h == (0, 1, 0):
            return -1.0
        if h == (1, 0):
            return 1.0
        return 2.0 * win  # (0, 1, 1) and (1, 1): showdown after a called bet


class LeducState:
    """Leduc poker (two players): cards 0-5 (rank = card // 2), raises of 2 then 4.

    Actions 0 = fold, 1 = call/check, 2 = raise; at most two raises per round; fold only
    when facing a bet; a pair with the public card beats any high card.
    """

    __slots__ = (
        "ante",
        "calls",
        "cur",
        "deck",
        "folded",
        "money",
        "pot",
        "private",
        "public",
        "raises",
        "round",
        "seq",
        "stakes",
    )

    def __init__(self) -> None:
        self.deck = [True] * 6
        self.private: list[int] = []
        self.public = -1
        self.round, self.stakes, self.ante = 1, 1, [1, 1]
        self.calls = self.raises = 0
        self.cur = -1  # chance
        self.folded = [False, False]
        self.seq: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        self.money, self.pot = [99.0, 99.0], 2.0

    def _copy(self) -> LeducState:
        new = LeducState.__new__(LeducState)
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(new, name, list(value) if isinstance(value, list) else value)
        return new

    def _ready(self) -> bool:
        remaining = 2 - sum(self.folded)
        if self.raises == 0:
            return self.calls == remaining
        return self.calls == remaining - 1

    def is_terminal(self) -> bool:
        return sum(self.folded) == 1 or (self.round == 2 and self._ready())

    def is_chance(self) -> bool:
        return self.cur == -1 and not self.is_terminal()

    def chance_outcomes(self) -> list[tuple[int, float]]:
        left = [c for c in range(6) if self.deck[c]]
        return [(c, 1.0 / len(left)) for c in left]

    def legal_actions(self) -> list[int]:
        moves = [0] if self.stakes > self.ante[self.cur] else []
        moves.append(1)
        if self.raises < 2:
            moves.append(2)
        return moves

    def current_player(self) -> int:
        return self.cur

    def _pay(self, player: int, amount: int) -> None:
        self.pot += amount
        self.ante[player] += amount
        self.money[player] -= amount

    def _append(self, move: int) -> None:
        r = self.round - 1
        self.seq = tuple((*s, move) if i == r else s for i, s in enumerate(self.seq))  # type: ignore[assignment]

    def child(self, action: int) -> LeducState:
        s = self._copy()
        if s.cur == -1:
            s.deck[action] = False
            if len(s.private) < 2:
                s.private.append(action)
                if len(s.private) == 2:
                    s.cur = 0
            else:
                s.public = action
                s.cur = 0 if not s.folded[0] else 1
            return s
        player = s.cur
        if action == 0:
            s._append(0)
            s.folded[player] = True
        elif action == 1:
            s._pay(player, s.stakes - s.ante[player])
            s.calls += 1
            s._append(1)
        else:
            s._pay(player, s.stakes - s.ante[player])
            amount = 2 if s.round == 1 else 4
            s.stakes += amount
            s._pay(player, amount)
            s.raises += 1
            s.calls = 0
            s._append(2)
        if s.is_terminal():
            s._resolve()
        elif action != 2 and s._ready():
            s.round, s.raises, s.calls, s.cur = 2, 0, 0, -1
        else:
            s.cur = 1 - player if not s.folded[1 - player] else player
        return s

    def _rank(self, player: int) -> int:
        low, high = sorted((self.public, self.private[player]))
        if low % 2 == 0 and high == low + 1:
            return 36 + low
        return (high // 2) * 6 + low // 2

    def _resolve(self) -> None:
        if sum(self.folded) == 1:
            self.money[self.folded.index(False)] += self.pot
        else:
            ranks = [self._rank(0), self._rank(1)]
            best = max(ranks)
            winners = [p for p in (0, 1) if ranks[p] == best]
            for p in winners:
                self.money[p] += self.pot / len(winners)
        self.pot = 0.0

    def info_key(self, player: int) -> str:
        return f"{player}:{self.private[player]}:{self.public}:{self.seq[0]}:{self.seq[1]}"

    def returns0(self) -> float:
        return self.money[0] - 100.0


class OpenSpielState:
    """An OpenSpiel state behind the same interface (compiling any two-player zero-sum game)."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state

    def is_terminal(self) -> bool:
        return self.state.is_terminal()

    def is_chance(self) -> bool:
        return self.state.is_chance_node()

    def chance_outcomes(self) -> list[tuple[int, float]]:
        return self.state.chance_outcomes()

    def legal_actions(self) -> list[int]:
        return self.state.legal_actions()

    def current_player(self) -> int:
        return self.state.current_player()

    def child(self, action: int) -> OpenSpielState:
        return OpenSpielState(self.state.child(action))

    def info_key(self, player: int) -> str:
        return self.state.information_state_string(player)

    def returns0(self) -> float:
        return float(self.state.returns()[0])


BUILTIN_GAMES = {"kuhn_poker": KuhnState, "leduc_poker": LeducState}
MAX_MOVES = 5_000  # the deepest game the tree compiler walks (tree.compile_tree recurses)
_GAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\(.*\))?")


def _check_game_string(name: str) -> None:
    """Refuse a game string that is not NAME or NAME(PARAMETERS) with balanced brackets."""
    depth = 0
    for char in name:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if not _GAME.fullmatch(name.strip()) or depth != 0:
        raise CfrError(
            f"bad game string {name!r}: expected NAME or NAME(KEY=VALUE,...) with balanced "
            "brackets, such as liars_dice(numdice=1)"
        )


def root_state(name: str, source: str = "auto") -> Any:
    """The root of game ``name``: built-in, or OpenSpiel's (``name`` may carry parameters).

    Args:
        name: ``kuhn_poker``, ``leduc_poker`` or any OpenSpiel game string such as
            ``liars_dice(numdice=1)``.
        source: ``builtin``, ``openspiel`` or ``auto`` (built-in when there is one).

    Raises:
        CfrError: unknown game, OpenSpiel missing, or not a two-player zero-sum
            sequential game with terminal payoffs.
    """
    if source not in ("auto", "builtin", "openspiel"):
        raise CfrError(f"unknown game source {source!r} (auto, builtin or openspiel)")
    if source != "openspiel" and name in BUILTIN_GAMES:
        return BUILTIN_GAMES[name]()
    if source == "builtin":
        raise CfrError(f"no built-in game {name!r}; built in: {', '.join(BUILTIN_GAMES)}")
    try:
        import pyspiel
    except ImportError:
        raise CfrError(
            f"game {name!r} needs OpenSpiel (pip install open_spiel); "
            f"built in: {', '.join(BUILTIN_GAMES)}"
        ) from None
    _check_game_string(name)
    base = name.split("(", 1)[0].strip()
    if base not in pyspiel.registered_names():
        raise CfrError(
            f"unknown game {base!r}: neither built in ({', '.join(BUILTIN_GAMES)}) "
            "nor an OpenSpiel game"
        )
    try:
        game = pyspiel.load_game(name)
        moves = game.max_game_length()
        root = game.new_initial_state()
    except (pyspiel.SpielError, ValueError, RuntimeError, MemoryError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise CfrError(f"game {name!r} cannot be made (bad parameters?): {first}") from None
    if not 0 < moves <= MAX_MOVES:
        raise CfrError(
            f"game {name!r}: games of up to {MAX_MOVES} moves can be solved, this one has "
            f"up to {moves} (bad parameters?)"
        )
    kind = game.get_type()
    problems = []
    if game.num_players() != 2:
        problems.append(f"{game.num_players()} players")
    if kind.utility not in (pyspiel.GameType.Utility.ZERO_SUM,):
        problems.append(f"utility {kind.utility.name.lower()}")
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        problems.append("simultaneous moves (load it with turn_based_simultaneous_game)")
    if kind.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        problems.append("sampled chance")
    if problems:
        raise CfrError(
            f"game {name!r} is not a two-player zero-sum sequential game: {', '.join(problems)}"
        )
    return OpenSpielState(root)
