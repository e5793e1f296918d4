from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from conveyor.platform.balancing.placement import PlacementWeights, resource_split

GB = 1e9
W = PlacementWeights()


def stats(cpu: float, used_gb: float = 4, total_gb: float = 16) -> dict[str, float]:
    return {"cpu_percent": cpu, "memory_used_bytes": used_gb * GB,
            "memory_available_bytes": (total_gb - used_gb) * GB,
            "memory_total_bytes": total_gb * GB}


@given(
    st.dictionaries(st.text(min_size=1, max_size=8), st.floats(0, 100), min_size=1,
                    max_size=12),
    st.integers(1, 64),
)
def test_every_queue_goes_to_exactly_one_member_within_twice_the_fair_share(
    cpus: dict[str, float], total: int
) -> None:
    members = {m: stats(c) for m, c in cpus.items()}
    split = resource_split(members, total, {}, W)
    queues = [q for qs in split.values() for q in qs]
    assert sorted(queues) == list(range(total))
    fair = -(-total // len(members))
    assert all(len(qs) <= 2 * fair for qs in split.values())


def test_the_split_is_deterministic_whatever_the_order_members_are_listed_in() -> None:
    a = {"d1": stats(10), "d2": stats(50), "d3": stats(90)}
    b = dict(reversed(list(a.items())))
    assert resource_split(a, 32, {}, W) == resource_split(b, 32, {}, W)


def test_busier_daemons_get_fewer_queues() -> None:
    split = resource_split({"idle": stats(5, 2), "busy": stats(95, 14)}, 16, {}, W)
    assert len(split["idle"]) > len(split["busy"]) >= 1


def test_equal_daemons_share_evenly() -> None:
    split = resource_split({f"d{i}": stats(30) for i in range(4)}, 16, {}, W)
    assert Counter(len(q) for q in split.values()) == Counter({4: 4})


def test_owners_keep_their_queues_through_small_changes() -> None:
    before = {"a": stats(30), "b": stats(32)}
    split = resource_split(before, 16, {}, W)
    owners = {q: m for m, qs in split.items() for q in qs}
    wiggled = {"a": stats(33), "b": stats(29)}  # a small swap in load
    assert resource_split(wiggled, 16, owners, W) == split
    moved = resource_split({"a": stats(99, 15), "b": stats(1, 1)}, 16, owners, W)
    assert len(moved["a"]) < len(split["a"])  # a large change does move queues
