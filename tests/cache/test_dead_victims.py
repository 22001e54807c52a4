"""Dead-KV victim choice (§9.3 step 1): longest dead first, leaves first, pinned subtrees skipped."""

from types import SimpleNamespace

from hybridcache.cache.host_eviction import dead_victims
from hybridcache.cache.records import BlockNode, Residency


def chain(first_id: int, length: int, root: BlockNode, *, on_device: bool) -> list[BlockNode]:
    """A chain of host-resident nodes under ``root`` (on the device too when ``on_device``)."""
    nodes, parent = [], root
    for offset in range(length):
        node = BlockNode(first_id + offset, parent, first_id + offset, (first_id + offset,), 0)
        parent.children[node.lookup_hash] = [node]
        node.host_state = Residency.RESIDENT
        node.device_state = Residency.RESIDENT if on_device else Residency.ABSENT
        nodes.append(node)
        parent = node
    return nodes


def index_with_dead(nodes: list[BlockNode]) -> SimpleNamespace:
    return SimpleNamespace(dead_nodes={node.id: node for node in nodes})


def test_victims_come_deepest_first_so_no_event_names_a_node_an_earlier_one_removed():
    root = BlockNode(0, None, 0, (), 0)
    host_only = chain(1, 3, root, on_device=False)
    picked = dead_victims(index_with_dead(host_only), 3)
    assert [n.id for n in picked] == [3, 2, 1]


def test_a_host_only_node_above_a_pinned_node_is_skipped_and_the_next_dead_ones_taken():
    root = BlockNode(0, None, 0, (), 0)
    blocked = chain(1, 2, root, on_device=False)
    pinned = chain(10, 1, blocked[-1], on_device=False)[0]
    pinned.active_refs = 1  # a lane maps it: its host-only ancestors cannot go
    free = chain(20, 2, root, on_device=False)
    picked = dead_victims(index_with_dead([*blocked, *free]), 2)
    assert [n.id for n in picked] == [21, 20]


def test_a_device_resident_dead_node_only_gives_up_its_host_copy_so_pins_below_do_not_matter():
    root = BlockNode(0, None, 0, (), 0)
    resident = chain(1, 1, root, on_device=True)
    chain(10, 1, resident[0], on_device=False)[0].active_refs = 1
    assert [n.id for n in dead_victims(index_with_dead(resident), 1)] == [1]


def test_the_choice_looks_only_at_the_longest_dead_window():
    root = BlockNode(0, None, 0, (), 0)
    old = chain(1, 1, root, on_device=True)
    young = chain(100, 200, root, on_device=True)  # the deepest of these died last: outside the window
    picked = dead_victims(index_with_dead([*old, *young]), 1)
    assert [n.id for n in picked] == [162]  # the window is 64 nodes: old + young[:63], deepest first
