"""Placement baselines (greedy, MXNet, BytePS) and PSLD's initial placement."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cmdare.errors import UnknownNameError, UserInputError
from cmdare.ps.blocks import param_infos
from cmdare.ps.placement import PLACEMENTS, Placement, get_placement
from cmdare.ps.psld.simulate import resnet32_params
from cmdare.ps.strategies import (
    BYTEPS_PARTITION_BYTES,
    BytePSPlacement,
    MXNetPlacement,
    PsldPlacement,
    djb2,
    name_hash,
)

ALL = ["round-robin", "greedy", "mxnet", "byteps", "psld"]


def _covers_exactly(placement: Placement, params) -> None:
    """Every element of every parameter is in exactly one block; ids are consecutive in model order."""
    assert [b.block_id for b in placement.blocks] == list(range(len(placement.blocks)))
    by_param: dict[int, list[tuple[int, int]]] = {}
    for b in placement.blocks:
        by_param.setdefault(b.param_index, []).append((b.start, b.size))
    for p in params:
        spans = sorted(by_param[p.index])
        pos = 0
        for start, size in spans:
            assert start == pos
            pos += size
        assert pos == p.numel
    order = [(b.param_index, b.start) for b in placement.blocks]
    assert order == sorted(order)


def test_registered_by_importing_placement_alone() -> None:
    code = "from cmdare.ps.placement import PLACEMENTS; print(sorted(PLACEMENTS))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in ALL:
        assert f"'{name}'" in out
    assert set(ALL) <= set(PLACEMENTS)


def test_unknown_placement_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_placement("nope")
    assert "greedy" in str(err.value) and "psld" in str(err.value) and "byteps" in str(err.value)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7])
def test_every_strategy_covers_the_model_exactly(name: str, num_shards: int) -> None:
    params = resnet32_params()
    pl = get_placement(name).place(params, num_shards)
    _covers_exactly(pl, params)
    assert pl.num_shards == num_shards and pl.strategy == name
    assert sum(pl.shard_bytes()) == sum(p.nbytes for p in params)


@pytest.mark.parametrize("name", ["greedy", "mxnet", "byteps", "psld"])
def test_zero_shards_is_a_user_error(name: str) -> None:
    with pytest.raises(UserInputError):
        get_placement(name).place(resnet32_params(), 0)


def test_greedy_gives_each_tensor_to_the_lightest_shard_in_model_order() -> None:
    params = param_infos([("a", (100,)), ("b", (60,)), ("c", (50,)), ("d", (20,)), ("e", (5,))])
    pl = get_placement("greedy").place(params, 2)
    # bytes: a 400 -> 0; b 240 -> 1; c 200 -> 1 (240 < 400); d 80 -> 0 (400 < 440); e 20 -> 1 (440 < 480)
    assert pl.shard_of == (0, 1, 1, 0, 1)
    assert pl.shard_bytes() == [480, 460]


def test_greedy_is_more_balanced_than_round_robin_on_resnet32() -> None:
    params = resnet32_params()

    def spread(pl: Placement) -> float:
        return max(pl.shard_bytes()) / min(pl.shard_bytes())
    assert spread(get_placement("greedy").place(params, 3)) < spread(get_placement("round-robin").place(params, 3))


def test_mxnet_hashes_small_arrays_and_slices_big_ones_evenly() -> None:
    params = param_infos([("small", (999_999,)), ("big", (1000, 1000)), ("tiny", (3,))])
    pl = MXNetPlacement().place(params, 3)
    small, *big, tiny = pl.blocks
    assert small.size == 999_999 and pl.shard_of[0] == name_hash("small") % 3
    assert [b.size for b in big] == [333_334, 333_333, 333_333]
    assert [pl.shard_of_block(b.block_id) for b in big] == [0, 1, 2]
    assert tiny.size == 3 and pl.shard_of[-1] == name_hash("tiny") % 3
    # a custom bound slices everything at or above it
    pl2 = MXNetPlacement(bigarray_bound=10).place(params, 2)
    assert len(pl2.blocks) == 2 + 2 + 1


def test_hashes_are_deterministic_across_processes() -> None:
    code = ("from cmdare.ps.strategies import name_hash, djb2; "
            "print(name_hash('layer3.4.conv2.weight'), djb2('layer3.4.conv2.weight:0'))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert runs == {f"{name_hash('layer3.4.conv2.weight')} {djb2('layer3.4.conv2.weight:0')}\n"}
    assert djb2("") == 5381 and djb2("a") == 5381 * 33 + ord("a")


def test_byteps_cuts_fixed_4mb_partitions_hashed_by_key() -> None:
    part = BYTEPS_PARTITION_BYTES // 4
    params = param_infos([("emb", (2 * part + 7,)), ("w", (10,))])
    pl = BytePSPlacement().place(params, 4)
    assert [b.size for b in pl.blocks] == [part, part, 7, 10]
    assert max(b.nbytes for b in pl.blocks) <= BYTEPS_PARTITION_BYTES
    assert pl.shard_of[1] == djb2("emb:1") % 4 and pl.shard_of[3] == djb2("w:0") % 4


def test_psld_initial_placement_bounds_blocks_and_balances_bytes() -> None:
    params = resnet32_params()
    for n in (2, 3, 4):
        strategy = PsldPlacement()
        pl = strategy.place(params, n)
        bound = strategy.block_bound(params, n)
        assert max(b.size for b in pl.blocks) <= bound
        held = pl.shard_bytes()
        assert max(held) / (sum(held) / n) < 1.02  # within 2% of a perfect byte split
    explicit = PsldPlacement(max_block_elems=5000).place(params, 4)
    assert max(b.size for b in explicit.blocks) <= 5000
    with pytest.raises(UserInputError):
        PsldPlacement(max_block_elems=0)
