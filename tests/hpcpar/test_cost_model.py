"""The cost model without MPI: crossovers, profiles, explain, simulate."""

from __future__ import annotations

import itertools
import json

import pytest

from hpcpar.collectives.cost.explain import plan_for
from hpcpar.collectives.cost.model import predict, rank_algorithms
from hpcpar.collectives.cost.simulate import simulate
from hpcpar.collectives.tally import Layout
from hpcpar.runtime.profile import (
    Level,
    Profile,
    ProfileError,
    default_profile,
    load_profile,
    parse_network,
    profile_from_json,
)

# A classic flat network (one rank per node), no hpcpar overheads: the textbook setting.
NETWORK = Profile("textbook", Level(1e-6, 1 / 10e9), Level(5e-6, 1 / 10e9), 1 / 20e9)


def flat(p: int) -> Layout:
    return Layout(tuple(range(p)))


def crossover(collective: str, small: str, large: str, p: int) -> int:
    """The first power-of-two size where ``large`` beats ``small``."""
    size = 8
    while size <= 1 << 30:
        a = predict(collective, small, flat(p), size // 8, 8, NETWORK).seconds
        b = predict(collective, large, flat(p), size // 8, 8, NETWORK).seconds
        if b < a:
            return size
        size *= 2
    raise AssertionError(f"{large} never beats {small}")


@pytest.mark.parametrize("p", [16, 64, 1024])
def test_recursive_doubling_vs_rabenseifner_crossover_at_a_few_kib(p):
    # Thakur, Rabenseifner and Gropp: recursive doubling for short messages,
    # Rabenseifner's algorithm beyond a few KiB.
    assert 1024 <= crossover("allreduce", "recursive_doubling", "rabenseifner", p) <= 64 * 1024


@pytest.mark.parametrize("p", [16, 64])
def test_binomial_vs_scatter_allgather_bcast_crossover(p):
    # van de Geijn: binomial trees for short broadcasts, scatter + allgather for long ones
    size = crossover("bcast", "binomial", "scatter_allgather", p)
    assert 64 * 1024 <= size <= 4 << 20


def test_scatter_allgather_crossover_grows_with_the_ring_latency():
    # its p-1 ring latencies push the crossover up as the job grows
    sizes = [crossover("bcast", "binomial", "scatter_allgather", p) for p in (16, 64, 1024)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_ring_loses_on_latency_and_wins_nothing_at_large_scale():
    small = rank_algorithms("allreduce", flat(256), 1, 8, NETWORK)
    assert small[-1].algorithm == "ring"  # 2(p-1) latencies
    big = {
        p.algorithm: p.seconds for p in rank_algorithms("allreduce", flat(8), 1 << 22, 8, NETWORK)
    }
    assert big["ring"] < big["recursive_doubling"]  # bandwidth-optimal beats log p full copies


def test_hierarchy_pays_off_with_a_slow_network():
    slow = Profile("slow", Level(0.3e-6, 1 / 20e9), Level(20e-6, 1 / 1e9), 1 / 20e9)
    layout = Layout(tuple(r // 16 for r in range(256)))
    ranking = [p.algorithm for p in rank_algorithms("allreduce", layout, 1 << 20, 8, slow)]
    assert ranking.index("multi_leader") < ranking.index("ring")
    assert ranking.index("two_level") < ranking.index("recursive_doubling")


def test_non_commutative_ops_get_only_order_keeping_algorithms():
    layout = Layout((0, 0, 1, 1))
    names = {
        p.algorithm
        for p in rank_algorithms("allreduce", layout, 100, 8, NETWORK, commutative=False)
    }
    assert "ring" not in names and "multi_leader" not in names and "two_level" in names
    names = {
        p.algorithm
        for p in rank_algorithms(
            "allreduce", Layout((0, 1, 0, 1)), 100, 8, NETWORK, commutative=False, contiguous=False
        )
    }
    assert names == {"mpi", "recursive_doubling", "rabenseifner"}


def test_library_time_interpolates_its_table():
    profile = profile_from_json(
        {
            **default_profile().to_json(),
            "mpi_library": {
                "allreduce": {"ranks": 4, "table": [[8, 1e-5], [8192, 4e-5], [1 << 20, 1e-3]]}
            },
        }
    )
    assert profile.library_time("allreduce", 8, 4) == pytest.approx(1e-5)
    assert 1e-5 < profile.library_time("allreduce", 1024, 4) < 4e-5
    assert profile.library_time("allreduce", 8, 2) is None  # measured at another rank count
    assert (
        predict("allreduce", "mpi", Layout((0, 0, 1, 1)), 1, 8, profile).note
        == "measured in the profile"
    )


def test_auto_follows_the_model_only_with_a_calibrated_profile():
    layout = Layout(tuple(r // 2 for r in range(8)))
    assert plan_for("allreduce", 1 << 24, layout, default_profile()).algorithm == "mpi"
    slow_library = {"allreduce": {"ranks": 8, "table": [[8, 1.0], [1 << 30, 1.0]]}}
    calibrated = profile_from_json(
        {**NETWORK.to_json(), "calibrated": True, "mpi_library": slow_library}
    )
    plan = plan_for("allreduce", 1 << 24, layout, calibrated)
    assert plan.algorithm == plan.ranking[0].algorithm and "fastest predicted" in plan.reason
    text = str(plan)
    assert "auto runs:" in text and "rabenseifner" in text


def test_auto_leaves_the_library_only_for_a_predicted_win_above_the_margin():
    layout = Layout(tuple(r // 2 for r in range(8)))
    base = {**NETWORK.to_json(), "calibrated": True}
    for nbytes in (8, 1 << 12, 1 << 24):
        ranking = plan_for("allreduce", nbytes, layout, profile_from_json(base)).ranking
        best = ranking[0]
        library = next(p for p in ranking if p.algorithm == "mpi")
        gain = 1 - best.seconds / library.seconds  # 0 when the library is predicted fastest
        for margin in (0.0, max(gain - 0.01, 0.0), min(gain + 0.01, 0.99)):
            plan = plan_for(
                "allreduce", nbytes, layout, profile_from_json({**base, "margin": margin})
            )
            expect = best.algorithm if gain > margin else "mpi"
            assert plan.algorithm == expect, (nbytes, margin, gain, plan.reason)
            if best.algorithm != "mpi" and gain <= margin:
                assert f"not {margin:.0%} faster than the MPI library's call" in plan.reason
    with pytest.raises(ProfileError, match=r"margin must be a number in \[0, 1\), not 1.5"):
        profile_from_json({**base, "margin": 1.5})


@pytest.mark.parametrize(
    ("text", "alpha", "bandwidth"),
    [("2us,25GB/s", 2e-6, 25e9), ("20us,10gbit", 20e-6, 1.25e9), ("1ms, 100MB/s", 1e-3, 1e8)],
)
def test_parse_network(text, alpha, bandwidth):
    level = parse_network(text)
    assert level.alpha_s == pytest.approx(alpha)
    assert 1 / level.beta_s_per_byte == pytest.approx(bandwidth)


@pytest.mark.parametrize(
    "text", ["2us", "fast,slow", "2 parsecs,1GB/s", "2us,0GB/s", "2us,25GB/s,3"]
)
def test_parse_network_rejects(text):
    with pytest.raises(ProfileError, match="bad network"):
        parse_network(text)


def test_profiles_round_trip_and_bad_files_are_clear(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps(NETWORK.to_json()))
    assert load_profile(good) == NETWORK
    cases = {
        "notjson.json": ("{not json", "not valid JSON"),
        "format.json": (json.dumps({"format": "other"}), "not an hpcpar profile"),
        "version.json": (
            json.dumps({**NETWORK.to_json(), "version": 9}),
            "unsupported profile version",
        ),
        "missing.json": (
            json.dumps({**NETWORK.to_json(), "levels": {"intra": {}}}),
            "missing levels.intra.alpha_s",
        ),
        "negative.json": (
            json.dumps({**NETWORK.to_json(), "gamma_s_per_byte": -1}),
            "gamma_s_per_byte must be",
        ),
        "table.json": (
            json.dumps({**NETWORK.to_json(), "mpi_library": {"bcast": {"table": "x"}}}),
            "table must be",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ProfileError, match=message) as info:
            load_profile(path)
        assert "\n" not in str(info.value)
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "absent.json")


def test_simulate_reaches_65536_ranks():
    rows = simulate("allreduce", [1, 1024], 64, [8, 1 << 30], NETWORK)
    winners = {(r.nodes, r.nbytes): r.algorithm for r in rows if r.winner}
    assert set(winners) == {(1, 8), (1, 1 << 30), (1024, 8), (1024, 1 << 30)}
    assert all(r.seconds > 0 for r in rows)
    assert winners[(1024, 8)] in ("recursive_doubling", "two_level", "pipelined")


def test_rules_files(tmp_path):
    from hpcpar.collectives.cost.rules import RulesError, load_rules, match_rule

    good = tmp_path / "rules.json"
    good.write_text(
        json.dumps(
            {
                "format": "hpcpar-rules",
                "version": 1,
                "allreduce": [
                    {"max_bytes": 65536, "algorithm": "recursive_doubling"},
                    {"min_nodes": 2, "algorithm": "multi_leader"},
                    {"algorithm": "ring"},
                ],
            }
        )
    )
    rules = load_rules(good)
    assert match_rule(rules, "allreduce", 1024, 4, 1) == "recursive_doubling"
    assert match_rule(rules, "allreduce", 1 << 20, 4, 2) == "multi_leader"
    assert match_rule(rules, "allreduce", 1 << 20, 4, 1) == "ring"
    assert match_rule(rules, "bcast", 8, 4, 1) is None
    bad = {
        "format": ({"format": "x"}, "not an hpcpar rules file"),
        "collective": (
            {"format": "hpcpar-rules", "version": 1, "gather": []},
            "unknown collective 'gather'",
        ),
        "algorithm": (
            {"format": "hpcpar-rules", "version": 1, "bcast": [{"algorithm": "ring"}]},
            "unknown algorithm 'ring'",
        ),
        "key": (
            {
                "format": "hpcpar-rules",
                "version": 1,
                "bcast": [{"algorithm": "binomial", "when": 1}],
            },
            "unknown key",
        ),
        "bound": (
            {
                "format": "hpcpar-rules",
                "version": 1,
                "bcast": [{"algorithm": "binomial", "max_bytes": -5}],
            },
            "max_bytes must be",
        ),
    }
    for name, (doc, message) in bad.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(RulesError, match=message):
            load_rules(path)


def test_pipelined_stages_overlap_fully_with_a_core_per_rank_and_on_the_link_without():
    from hpcpar.collectives.algorithms.pipelined import segment_elements

    layout = Layout(tuple(r // 2 for r in range(8)))
    crowded = profile_from_json({**NETWORK.to_json(), "oversubscribed": True})
    assert crowded.oversubscribed and not NETWORK.oversubscribed
    segment = segment_elements(8)
    for segments in (1, 4):
        free = predict("allreduce", "pipelined", layout, segments * segment, 8, NETWORK)
        busy = predict("allreduce", "pipelined", layout, segments * segment, 8, crowded)
        first = free.seconds - free.parts["overlap"]
        assert busy.seconds - busy.parts["overlap"] == pytest.approx(first)
        # overlapped: each later segment pays its slowest stage; queued for the cores:
        # every stage's core time, or the link's time if that is longer
        assert busy.parts["overlap"] >= free.parts["overlap"]
        one = predict("allreduce", "pipelined", layout, segment, 8, crowded).parts
        core = sum(one[k] for k in ("intra", "reduce", "software")) - crowded.call_s
        slowest = free.parts["overlap"] / max(segments - 1, 1)
        assert busy.parts["overlap"] == pytest.approx(
            (segments - 1) * max(core, one["inter"], slowest)
        )
    # a slow link: the link, not the cores, sets each later segment's time, as with a
    # core per rank
    doc = crowded.to_json()
    doc["levels"]["inter"] = {"alpha_s": 1e-5, "beta_s_per_byte": 1e-8}
    slow = profile_from_json(doc)
    one = predict("allreduce", "pipelined", layout, segment, 8, slow).parts
    four = predict("allreduce", "pipelined", layout, 4 * segment, 8, slow).parts
    assert one["inter"] > sum(one[k] for k in ("intra", "reduce", "software"))
    doc["oversubscribed"] = False
    free = predict("allreduce", "pipelined", layout, 4 * segment, 8, profile_from_json(doc))
    assert four["overlap"] == pytest.approx(free.parts["overlap"])
    assert 3 * one["inter"] <= four["overlap"] < 3 * (one["inter"] + one["reduce"] + one["intra"])


def test_crowded_machine_hides_python_behind_the_link_not_copies():
    # 3 nodes x 2 ranks; hpcpar's Python costs 300 us a call (as calibrated on 6 ranks
    # sharing 2 cores): with a slow link it runs while messages travel.
    layout = Layout((0, 0, 1, 1, 2, 2))
    doc = NETWORK.to_json()
    doc["levels"]["inter"] = {"alpha_s": 1e-5, "beta_s_per_byte": 1e-8}
    doc["software"] = {"call_s": 3e-4, "step_s": 0.0, "library_call_s": 0.0}
    free = profile_from_json(doc)
    crowded = profile_from_json({**doc, "oversubscribed": True})
    for algorithm in ("two_level", "rabenseifner", "ring"):
        for count in (1, 1 << 14):  # 8 B: the link is quick; 128 KiB: it is not
            a = predict("allreduce", algorithm, layout, count, 8, free)
            b = predict("allreduce", algorithm, layout, count, 8, crowded)
            # the slowest rank may differ when little is hidden: compare each with itself
            hidden = min(b.parts["inter"], b.parts["software"])
            assert b.parts["overlap"] == pytest.approx(-hidden)
            assert b.seconds == pytest.approx(
                sum(v for k, v in b.parts.items() if k != "overlap") - hidden
            )
            assert a.seconds - a.parts["software"] <= b.seconds <= a.seconds
            assert b.seconds >= max(b.parts["inter"], b.parts["software"])
            if count > 1:  # the link's time exceeds the Python's: all of it hidden
                assert b.worst_rank == a.worst_rank and hidden == pytest.approx(3e-4)
                assert b.seconds == pytest.approx(a.seconds - 3e-4)
                # copies and reductions are never hidden
                assert (b.parts["intra"], b.parts["reduce"]) == (
                    a.parts["intra"],
                    a.parts["reduce"],
                )


def test_library_modelled_without_hpcpar_python_on_a_crowded_machine():
    # no library timings: the library's call is priced as its best classic algorithm
    # without hpcpar's Python, and nothing of that Python may be taken off twice
    layout = Layout((0, 0, 1, 1, 2, 2))
    doc = NETWORK.to_json()
    doc["levels"]["inter"] = {"alpha_s": 1e-5, "beta_s_per_byte": 1e-8}
    doc["software"] = {"call_s": 3e-4, "step_s": 0.0, "library_call_s": 2e-5}
    for crowded in (False, True):
        profile = profile_from_json({**doc, "oversubscribed": crowded})
        bare = profile_from_json(
            {**doc, "software": {"call_s": 0.0, "step_s": 0.0, "library_call_s": 2e-5}}
        )
        for count in (1, 1 << 14):
            lib = predict("allreduce", "mpi", layout, count, 8, profile)
            ref = predict("allreduce", "mpi", layout, count, 8, bare)
            assert lib.seconds == pytest.approx(ref.seconds)
            assert sum(lib.parts.values()) == pytest.approx(lib.seconds)


def test_tied_predictions_rank_the_algorithm_sending_fewer_messages_first():
    # 2 nodes x 2 ranks, a slow link, 32 bytes: two-level and multi-leader cost the
    # slowest rank the same, but multi-leader has every rank cross the link (on the
    # virtual cluster it measured 1.2-1.4x slower); fewer messages in all goes first.
    from hpcpar.collectives.cost.counts import counts_for
    from hpcpar.collectives.cost.model import TIE

    slow = Profile("slow", Level(10e-6, 1 / 1e9), Level(30e-6, 1 / 0.15e9), 1 / 30e9)
    layout = Layout((0, 0, 1, 1))
    ranking = rank_algorithms("allreduce", layout, 4, 8, slow)
    by_name = {p.algorithm: p for p in ranking}
    for p in ranking:
        if p.algorithm == "mpi":
            continue
        sent = [counts_for("allreduce", p.algorithm, layout, r, 4, 8) for r in range(4)]
        assert p.messages == sum(c.messages_intra + c.messages_inter for c in sent)
    two, multi = by_name["two_level"], by_name["multi_leader"]
    assert abs(two.seconds - multi.seconds) <= TIE * min(two.seconds, multi.seconds)
    assert two.messages < multi.messages
    names = [p.algorithm for p in ranking]
    assert names.index("two_level") < names.index("multi_leader")
    # outside a tie the time decides, whatever the messages
    seconds = [p.seconds for p in ranking]
    assert all(b >= a * (1 - TIE) for a, b in itertools.pairwise(seconds))
    assert seconds[0] <= min(seconds) * (1 + TIE)


def test_a_fold_puts_the_whole_vector_on_the_absorbing_ranks_path():
    # Rabenseifner on 3 ranks, one per node: rank 1 receives rank 0's vector (the fold),
    # halves and doubles with rank 2 (n/2 each way), sends the result back to rank 0:
    # 3n over its link, where the ring moves 4/3 n. Bandwidth only, by hand.
    from hpcpar.collectives.algorithms import ALGORITHMS

    def senders(name, layout, rank):
        return ALGORITHMS["allreduce"][name].senders(layout, rank)

    beta = 1 / 1e9
    bandwidth_only = Profile("bw", Level(0.0, 1 / 100e9), Level(0.0, beta), 0.0)
    n = 3 << 20
    rab = predict("allreduce", "rabenseifner", flat(3), n // 8, 8, bandwidth_only)
    assert rab.worst_rank == 1
    assert rab.parts["inter"] == pytest.approx(3 * n * beta)
    ring = predict("allreduce", "ring", flat(3), n // 8, 8, bandwidth_only)
    assert ring.parts["inter"] == pytest.approx(4 / 3 * n * beta)
    # folded ranks sit out: 6 ranks on 3 nodes fold ranks 0 and 2 into 1 and 3, so one
    # rank per node drives the first two links and two the third
    layout = Layout((0, 0, 1, 1, 2, 2))
    assert [senders("rabenseifner", layout, r) for r in range(6)] == [1, 1, 1, 1, 2, 2]
    assert [senders("ring", layout, r) for r in range(6)] == [1] * 6
    assert [senders("multi_leader", layout, r) for r in range(6)] == [2] * 6


def test_three_leaders_take_the_ring_for_large_commutative_vectors():
    from hpcpar.collectives.algorithms.two_level import leaders_use_ring
    from hpcpar.collectives.cost.counts import counts_for

    assert leaders_use_ring(3, 1 << 20, True)
    assert not leaders_use_ring(3, 1 << 20, False)  # the ring reorders operands
    assert not leaders_use_ring(4, 1 << 20, True)  # no fold to avoid
    assert not leaders_use_ring(2, 1 << 20, True)
    assert not leaders_use_ring(3, 64 << 10, True)  # small blocks: latency wins
    assert not leaders_use_ring(1000, 16 << 20, True)  # 2 x 999 latencies
    assert leaders_use_ring(1000, 64 << 20, True)
    # two-level on 3 nodes x 2 ranks: the leaders' share of the link is the ring's
    layout = Layout((0, 0, 1, 1, 2, 2))
    n = 1 << 20
    leader = counts_for("allreduce", "two_level", layout, 0, n, 8)
    assert abs(leader.bytes_inter - 4 / 3 * n * 8) <= 16  # 2(p-1)/p of the vector
    assert leader.waited_inter == 0
