"""Batch on its own: construction checks, every row / column operation, and cheap pickling of chunks."""

import pickle

import numpy as np
import pytest
import torch

from or1.hybrid.batch import Batch


def make(n: int = 6) -> Batch:
    return Batch(
        tensors={"ids": torch.arange(n * 3).reshape(n, 3), "score": torch.arange(n, dtype=torch.float32)},
        non_tensor={"prompt": [f"p{i}" for i in range(n)], "gt": [{"answer": i} for i in range(n)]},
        meta={"temperature": 1.0},
    )


def rows(batch: Batch) -> list[str]:
    return list(batch["prompt"])


def test_construction_checks_row_counts_and_converts_lists_to_object_arrays():
    b = make()
    assert len(b) == 6 and b["prompt"].dtype == object and b["gt"][2] == {"answer": 2}
    with pytest.raises(ValueError, match="different row counts"):
        Batch(tensors={"a": torch.zeros(3)}, non_tensor={"b": ["x", "y"]})
    with pytest.raises(ValueError, match="row dimension"):
        Batch(tensors={"a": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="both tensor and non-tensor"):
        Batch(tensors={"a": torch.zeros(2)}, non_tensor={"a": ["x", "y"]})


def test_lists_of_equal_length_lists_stay_one_object_per_row():
    b = Batch(non_tensor={"stops": [[1, 2], [3, 4], [5, 6]]})
    assert b["stops"].shape == (3,) and b["stops"][1] == [3, 4]


def test_meta_only_batch_has_length_zero():
    assert len(Batch(meta={"step": 1})) == 0


def test_getitem_and_contains():
    b = make()
    assert torch.equal(b["score"], torch.arange(6, dtype=torch.float32))
    assert "prompt" in b and "nope" not in b
    with pytest.raises(KeyError, match="no column 'nope'"):
        b["nope"]


def test_from_rows_stacks_tensors_and_collects_objects():
    b = Batch.from_rows([{"x": torch.tensor([i, i]), "s": f"r{i}"} for i in range(3)], meta={"k": 1})
    assert b["x"].shape == (3, 2) and list(b["s"]) == ["r0", "r1", "r2"] and b.meta == {"k": 1}
    with pytest.raises(ValueError, match="row 1 has keys"):
        Batch.from_rows([{"x": 1}, {"y": 2}])
    assert len(Batch.from_rows([])) == 0


def test_chunk_gives_equal_contiguous_parts_and_rejects_uneven_splits():
    parts = make(6).chunk(3)
    assert [rows(p) for p in parts] == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]
    assert torch.equal(parts[1]["ids"], torch.arange(6, 12).reshape(2, 3))
    assert all(p.meta == {"temperature": 1.0} for p in parts)
    with pytest.raises(ValueError, match="cannot chunk a Batch of 5 rows into 2"):
        make(5).chunk(2)
    with pytest.raises(ValueError, match="n >= 1"):
        make(4).chunk(0)


def test_concat_inverts_chunk_and_merges_meta():
    b = make(6)
    back = Batch.concat(b.chunk(3))
    assert rows(back) == rows(b) and torch.equal(back["ids"], b["ids"]) and back.meta == b.meta
    parts = [
        Batch(tensors={"a": torch.zeros(1)}, meta={"x": 1}),
        Batch(tensors={"a": torch.ones(1)}, meta={"y": 2}),
    ]
    assert Batch.concat(parts).meta == {"x": 1, "y": 2}


def test_concat_errors_on_meta_conflict_mismatched_columns_and_empty_input():
    a = Batch(tensors={"a": torch.zeros(1)}, meta={"x": 1})
    with pytest.raises(ValueError, match="meta 'x' differs"):
        Batch.concat([a, Batch(tensors={"a": torch.zeros(1)}, meta={"x": 2})])
    with pytest.raises(ValueError, match="part 1 has columns"):
        Batch.concat([a, Batch(tensors={"b": torch.zeros(1)})])
    with pytest.raises(ValueError, match="at least one part"):
        Batch.concat([])


def test_union_adds_columns_and_accepts_identical_shared_keys():
    b = make(4)
    extra = Batch(tensors={"logp": torch.ones(4)}, non_tensor={"prompt": rows(b)}, meta={"step": 3})
    u = b.union(extra)
    assert set(u.keys()) == {"ids", "score", "prompt", "gt", "logp"}
    assert u.meta == {"temperature": 1.0, "step": 3}
    assert set(b.keys()) == {"ids", "score", "prompt", "gt"}  # the inputs are untouched
    assert len(b.union(Batch(meta={"m": 1}))) == 4  # a meta-only batch unions with anything


def test_union_errors_on_conflicting_values_and_lengths():
    b = make(4)
    with pytest.raises(ValueError, match="tensor column 'score' differs"):
        b.union(Batch(tensors={"score": torch.zeros(4)}))
    with pytest.raises(ValueError, match="tensor column 'score' differs"):  # same values, other dtype
        b.union(Batch(tensors={"score": torch.arange(4)}))
    with pytest.raises(ValueError, match="non-tensor column 'prompt' differs"):
        b.union(Batch(non_tensor={"prompt": ["a", "b", "c", "d"]}))
    with pytest.raises(ValueError, match="meta 'temperature' differs"):
        b.union(Batch(meta={"temperature": 0.6}))
    with pytest.raises(ValueError, match="4 and 3 rows"):
        b.union(Batch(tensors={"x": torch.zeros(3)}))


def test_repeat_interleaved_forms_groups_and_tiled_repeats_the_batch():
    b = make(2)
    grouped = b.repeat(3)
    assert rows(grouped) == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert torch.equal(grouped["ids"][:3], b["ids"][:1].expand(3, 3))
    tiled = b.repeat(2, interleave=False)
    assert rows(tiled) == ["p0", "p1", "p0", "p1"] and torch.equal(tiled["ids"], torch.cat([b["ids"]] * 2))
    assert tiled["gt"][2] == {"answer": 0}
    with pytest.raises(ValueError, match="n >= 1"):
        b.repeat(0)


@pytest.mark.parametrize(
    "idx",
    [[4, 0, 2], np.array([4, 0, 2]), torch.tensor([4, 0, 2])],
    ids=["list", "numpy", "tensor"],
)
def test_select_by_indices(idx):
    s = make(6).select(idx)
    assert rows(s) == ["p4", "p0", "p2"] and torch.equal(s["score"], torch.tensor([4.0, 0.0, 2.0]))


def test_select_by_slice_mask_and_empty():
    b = make(6)
    assert rows(b.select(slice(1, 5, 2))) == ["p1", "p3"]
    assert rows(b.select(np.array([True, False] * 3))) == ["p0", "p2", "p4"]
    assert rows(b.select(torch.tensor([False] * 5 + [True]))) == ["p5"]
    empty = b.select([])
    assert len(empty) == 0 and empty["ids"].shape == (0, 3)


def test_select_rejects_bad_indices():
    b = make(3)
    with pytest.raises(ValueError, match="mask has shape"):
        b.select([True, False])
    with pytest.raises(IndexError, match="out of range"):
        b.select([3])
    with pytest.raises(TypeError, match="select"):
        b.select(1)
    with pytest.raises(TypeError, match="integer index"):
        b.select([0.5])


@pytest.mark.parametrize("n,k,pad", [(5, 2, 1), (6, 4, 2), (1, 4, 3), (4, 4, 0), (0, 3, 0)])
def test_pad_to_multiple_repeats_leading_rows_and_unpad_restores(n, k, pad):
    b = make(n)
    padded, got = b.pad_to_multiple(k)
    assert got == pad and len(padded) % k == 0 and len(padded) == n + pad
    assert rows(padded)[n:] == [f"p{i % n}" for i in range(pad)]
    restored = padded.unpad(got)
    assert rows(restored) == rows(b) and torch.equal(restored["ids"], b["ids"])


def test_unpad_checks_its_argument():
    with pytest.raises(ValueError, match="cannot unpad 4 rows from a Batch of 3"):
        make(3).unpad(4)


def test_only_and_drop_pick_columns():
    b = make(3)
    assert set(b.only(["ids", "prompt"]).keys()) == {"ids", "prompt"}
    assert set(b.drop(["ids", "missing"]).keys()) == {"score", "prompt", "gt"}
    with pytest.raises(KeyError, match="no columns"):
        b.only(["missing"])


def test_to_moves_tensors_only():
    b = make(2).to("cpu")
    assert b["ids"].device.type == "cpu" and b["prompt"].dtype == object


def test_pickle_round_trip_keeps_every_column_and_meta():
    b = make(4)
    back = pickle.loads(pickle.dumps(b))
    assert torch.equal(back["ids"], b["ids"]) and rows(back) == rows(b) and back["gt"][3] == {"answer": 3}
    assert back.meta == b.meta


def test_pickled_chunk_ships_only_its_rows():
    big = Batch(tensors={"x": torch.zeros(1000, 256)}, non_tensor={"s": ["a"] * 1000})
    whole = len(pickle.dumps(big))
    part = big.chunk(100)[3]
    assert part["x"].untyped_storage().nbytes() == whole_storage(big)  # in memory a chunk is a cheap view
    assert len(pickle.dumps(part)) < whole / 50
    sel = big.select(slice(0, 1000, 100))  # strided view: compacted too
    assert len(pickle.dumps(sel)) < whole / 50


def test_pickle_detaches_tensors_that_require_grad():
    w = torch.ones(2, requires_grad=True)
    back = pickle.loads(pickle.dumps(Batch(tensors={"y": w * 2})))
    assert not back["y"].requires_grad and torch.equal(back["y"], torch.full((2,), 2.0))


def whole_storage(batch: Batch) -> int:
    return batch["x"].untyped_storage().nbytes()
