"""What a CPU server gets by default: the compute dtype `--dtype auto` picks, KV and state memory that is
committed only where touched, and decode attention that reads a lane's pages in place when they are
consecutive (the same logits as gathering them)."""

from __future__ import annotations

from pathlib import Path

import torch
from model_testkit import Lane, fresh_memory, prompt_tokens

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.gpu.dtype_choice import choose_dtype, cpu_flags
from hybridcache.gpu.model.attention import context_rows
from hybridcache.gpu.zeroed_memory import MAPPED_MIN_BYTES, zeroed
from hybridcache.tools.decode_bound import decode_step_bytes

CPU = torch.device("cpu")
AMX = frozenset({"avx512f", "amx_bf16", "amx_tile"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
PLAIN_AVX512 = frozenset({"avx512f", "avx512bw"})


# -- --dtype auto ----------------------------------------------------------------------------------------


def test_auto_runs_a_bf16_checkpoint_in_bf16_where_the_cpu_computes_it_natively():
    for flags in (AMX, AVX512_BF16):
        choice = choose_dtype("auto", CPU, torch.bfloat16, flags)
        assert choice.dtype == torch.bfloat16
        assert "native" in choice.reason


def test_auto_falls_back_to_float32_and_says_why():
    choice = choose_dtype("auto", CPU, torch.bfloat16, PLAIN_AVX512)
    assert choice.dtype == torch.float32 and "no avx512_bf16/amx_bf16" in choice.reason
    assert choose_dtype("auto", CPU, torch.float32, AMX).dtype == torch.float32
    assert choose_dtype("auto", CPU, torch.float16, AMX).dtype == torch.float32


def test_an_explicit_dtype_and_a_gpu_are_taken_as_they_are():
    assert choose_dtype("bfloat16", CPU, torch.float32, PLAIN_AVX512).dtype == torch.bfloat16
    assert choose_dtype("float32", CPU, torch.bfloat16, AMX).dtype == torch.float32
    assert choose_dtype("auto", torch.device("cuda"), torch.bfloat16, frozenset()).dtype is None


def test_cpu_flags_are_read_from_the_first_processor(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx512f", "amx_bf16"})
    assert cpu_flags(tmp_path / "absent") == frozenset()


# -- memory committed as touched -------------------------------------------------------------------------


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_a_large_zeroed_tensor_costs_no_resident_memory_until_written():
    before = resident_bytes()
    tensor = zeroed((256, 1024, 1024), torch.uint8)  # 256 MiB
    assert resident_bytes() - before < 32 << 20, "creating the tensor committed its memory"
    tensor[:16].fill_(7)  # 16 MiB
    grown = resident_bytes() - before
    assert 16 << 20 <= grown < 64 << 20
    assert int(tensor[:16].sum()) == 7 * (16 << 20) and int(tensor[200].sum()) == 0


def test_small_zeroed_tensors_are_ordinary_and_zero():
    tensor = zeroed((4, 8), torch.float32)
    assert tensor.numel() * 4 < MAPPED_MIN_BYTES and torch.equal(tensor, torch.zeros(4, 8))


def test_kv_pools_and_state_slots_start_zero(dense_model):
    memory = fresh_memory(dense_model, num_pages=4, num_slots=2)
    assert all(int(plane.count_nonzero()) == 0 for plane in memory.kv.planes() + memory.states.planes())


# -- decode attention reads consecutive pages in place ------------------------------------------------------


def test_context_rows_are_a_slice_for_consecutive_pages_and_an_index_otherwise():
    assert context_rows([5, 6, 7], 150, 64) == slice(320, 470)
    rows = context_rows([5, 9, 6], 150, 64)
    assert isinstance(rows, torch.Tensor)
    expected = [page * 64 + i for page, count in ((5, 64), (9, 64), (6, 22)) for i in range(count)]
    assert rows.tolist() == expected


def test_decode_logits_do_not_depend_on_whether_the_pages_are_consecutive(dense_model):
    prompt = prompt_tokens(150)
    results = []
    for table in ([PageId(2), PageId(3), PageId(4), PageId(5)], [PageId(7), PageId(1), PageId(5), PageId(3)]):
        memory = fresh_memory(dense_model, num_pages=8, num_slots=2)
        lane = Lane(table, SlotId(1))
        dense_model.prefill(prompt[:100], 0, lane.table, lane.slot, memory.kv, memory.states)
        chunk = dense_model.prefill(prompt[100:], 100, lane.table, lane.slot, memory.kv, memory.states)
        step = dense_model.decode([11], [150], [lane.table], [lane.slot], memory.kv, memory.states)
        results.append((chunk, step))
    assert torch.equal(results[0][0], results[1][0]), "a resumed prefill chunk changed with the page layout"
    assert torch.equal(results[0][1], results[1][1]), "a decode step changed with the page layout"


# -- the decode bound counts every weight a step reads ----------------------------------------------------


def test_decode_step_bytes_count_the_loaded_matmul_weights(dense_model):
    config = dense_model.config
    weights = 0
    for layer in dense_model.layers:
        mixer, feed_forward = layer.mixer, layer.feed_forward
        matrices = [mixer.out_proj] if hasattr(mixer, "in_proj") else [mixer.o_proj]
        matrices.append(mixer.in_proj if hasattr(mixer, "in_proj") else mixer.qkv_proj)
        matrices += [feed_forward.gate_up_proj, feed_forward.down_proj]
        weights += sum(matrix.numel() for matrix in matrices)
    weights += sum(block.numel() for block in dense_model.lm_head)
    counted = decode_step_bytes(config, torch.float32, context=99)
    assert counted.weights == weights * 4
    kv_row = config.num_key_value_heads * config.head_dim * 4
    assert counted.kv == len(config.full_attention_layers) * 2 * 100 * kv_row


# -- embedding rows read from the file ---------------------------------------------------------------------


def test_embedding_rows_read_from_the_file_equal_the_mapped_table(dense_checkpoint: Path):
    import pytest

    from hybridcache.gpu.model.checkpoint import CheckpointWeights
    from hybridcache.gpu.model.embedding_rows import EmbeddingRows

    weights = CheckpointWeights(dense_checkpoint)
    table = weights.tensor("model.embed_tokens.weight")
    path, offset, entry = weights.location("model.embed_tokens.weight")
    rows = EmbeddingRows(path, offset, entry.shape[0], entry.shape[1], entry.dtype, torch.bfloat16)
    ids = torch.tensor([0, 5, 5, table.shape[0] - 1])
    assert torch.equal(rows.lookup(ids), table[ids].to(torch.bfloat16))
    with pytest.raises(IndexError, match="outside the embedding table"):
        rows.lookup(torch.tensor([table.shape[0]]))
    rows.close()
