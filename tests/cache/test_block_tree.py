"""BlockTree (spec §5.1, §6.1, §13.1): exact identity, extra keys, collisions, tails, F <= n-1."""

import pytest
from cache_factories import (
    assert_reuses,
    checked_cache,
    insert_path,
    match_depth,
    prompt,
    run_request,
    tokens,
)

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.match import PromptInput, match
from hybridcache.cache.records import BlockNode, SnapshotKind, pack_tokens


def test_blocks_inserted_by_a_request_match_exactly_and_only_below_n_minus_1():
    cache = checked_cache()
    prompt_tokens = tokens(5 * BLOCK_TOKENS)
    insert_path(cache, prompt_tokens)
    assert match_depth(cache, prompt_tokens) == 4  # block 4 would cover the last token: never matched
    assert match_depth(cache, [*prompt_tokens, 1]) == 5
    edited = list(prompt_tokens)
    edited[130] += 1  # inside block 2
    assert match_depth(cache, [*edited, 1]) == 2


def test_a_different_extra_key_misses_even_with_identical_tokens():
    cache = checked_cache()
    prompt_tokens = tokens(3 * BLOCK_TOKENS)
    image_a = [0, 11, 11]
    insert_path(cache, prompt_tokens, extras=image_a)
    assert match_depth(cache, [*prompt_tokens, 1], extras=[*image_a, 0]) == 3
    assert match_depth(cache, [*prompt_tokens, 1], extras=[0, 22, 22, 0]) == 1


def test_a_forced_constant_lookup_hash_never_produces_a_false_hit():
    cache = checked_cache()
    constant = [7] * 4
    first, second, stranger = tokens(256, seed=1), tokens(256, seed=2), tokens(256, seed=3)
    insert_path(cache, first, hashes=constant, lane=1)
    insert_path(cache, second, hashes=constant, lane=2)
    assert len(cache.index.root.children[7]) == 2  # both first blocks collide in one bucket
    assert match_depth(cache, [*stranger, 1], hashes=constant) == 0
    assert match_depth(cache, [*first, 1], hashes=constant) == 4
    assert match_depth(cache, [*second, 1], hashes=constant) == 4


def test_a_tail_snapshot_matches_only_its_exact_tail_tokens():
    cache = checked_cache()
    turn = tokens(300)
    _, _, finished = run_request(cache, turn)
    endpoint = cache.index.snapshots[finished.endpoint]
    assert endpoint.kind == SnapshotKind.ENDPOINT and len(endpoint.tail_tokens) == 300 - 256
    assert_reuses(cache, [*turn, 5], 300)
    changed_tail = list(turn)
    changed_tail[290] += 1
    assert_reuses(cache, [*changed_tail, 5], 0)


def test_frontier_must_stay_at_most_n_minus_1():
    cache = checked_cache()
    turn = tokens(300)
    run_request(cache, turn)
    assert_reuses(cache, turn, 0)  # F = 300 = n: at least one token must be prefilled
    assert_reuses(cache, [*turn, 9], 300)


def test_publishing_a_duplicate_snapshot_is_a_no_op():
    cache = checked_cache()
    turn = tokens(200)
    lanes = (0, 1)
    for lane in lanes:
        staged = cache.stage(cache.quote(prompt(turn)), lane)
        assert staged.reuse_tokens == 0
        cache.activate(lane)
        assert cache.take_tap(lane, 128).slot is not None
    assert cache.publish_ready_taps(0, turn[:100]).published == ()  # block 1 not committed yet
    for lane in lanes:
        cache.commit_blocks(lane, turn)
    published = cache.publish_ready_taps(0, turn)
    duplicate = cache.publish_ready_taps(1, turn)
    assert [tap.position for tap in published.published] == [128]
    assert duplicate.published == () and duplicate.dropped == (128,)
    assert len(cache.index.snapshots) == 1


def test_the_packed_byte_walk_matches_exactly_like_the_token_walk():
    cache = checked_cache()
    constant = [7] * 4
    first, second = tokens(256, seed=1), tokens(256, seed=2)
    insert_path(cache, first, hashes=constant, lane=1)
    insert_path(cache, second, hashes=constant, lane=2)
    for probe in ([*first, 1], [*second, 1], [*tokens(256, seed=3), 1], [*first[:130], *second[130:], 1]):
        by_tokens = match(cache.index, PromptInput(probe, constant))
        by_bytes = match(cache.index, PromptInput(probe, constant, token_bytes=pack_tokens(probe)))
        assert [n.id for n in by_bytes.path] == [n.id for n in by_tokens.path]
    with pytest.raises(ValueError, match="token_bytes"):
        match(cache.index, PromptInput([*first, 1], constant, token_bytes=pack_tokens(first)))


def test_a_lone_child_is_filed_as_itself_and_colliding_ones_share_a_list():
    parent = BlockNode(0, None, 0, (), 0)  # type: ignore[arg-type]
    first, second, third = (BlockNode(i, parent, 7 if i < 3 else 8, (i,), 0) for i in (1, 2, 3))  # type: ignore[arg-type]
    parent.add_child(first)
    assert parent.children == {7: first} and parent.children_under(7) == (first,)
    parent.add_child(second)  # the same lookup hash: a bucket list, in filing order
    parent.add_child(third)
    assert parent.children == {7: [first, second], 8: third}
    assert parent.iter_children() == [first, second, third]
    assert parent.child(7, (2,), 0) is second and parent.child(7, (3,), 0) is None
    parent.remove_child(first)
    assert list(parent.children_under(7)) == [second]
    parent.remove_child(second)
    parent.remove_child(third)
    assert parent.children == {} and parent.children_under(7) == ()
    with pytest.raises(KeyError):
        parent.remove_child(third)
