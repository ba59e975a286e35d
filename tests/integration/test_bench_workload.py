"""The offline benchmark's building blocks: the ShareGPT workload and the transformers
static-batching baseline."""

from __future__ import annotations

import json

import pytest
import torch

from bench.engine.hf_static import left_padded_batch, run_hf_static
from bench.datasets.sharegpt import BenchRequest, iter_sharegpt_records, load_sharegpt_requests, sharegpt_path
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

pytestmark = pytest.mark.slow


def _record(i: int) -> dict:
    return {"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i} " + '], {"x": "}'},
                                             {"from": "gpt", "value": f"a{i}"}]}


def test_parser_stops_at_truncated_tail(tmp_path):
    whole = json.dumps([_record(i) for i in range(3)], indent=2)
    cut = whole[: whole.index('"r2"') + 20]  # the file ends inside the third record
    path = tmp_path / "cut.json"
    path.write_text(cut)
    assert list(iter_sharegpt_records(path)) == [_record(0), _record(1)]


def test_parser_reads_a_complete_list_and_rejects_non_lists(tmp_path):
    path = tmp_path / "whole.json"
    path.write_text(json.dumps([_record(i) for i in range(4)]))
    assert [r["id"] for r in iter_sharegpt_records(path)] == ["r0", "r1", "r2", "r3"]
    (tmp_path / "empty.json").write_text(" [ ] ")
    assert list(iter_sharegpt_records(tmp_path / "empty.json")) == []
    (tmp_path / "obj.json").write_text('{"a": 1}')
    with pytest.raises(ValueError):
        list(iter_sharegpt_records(tmp_path / "obj.json"))


def test_parser_reads_the_real_file():
    assert sharegpt_path().is_file()
    records = iter_sharegpt_records()
    first = [next(records) for _ in range(5)]
    records.close()
    assert all(isinstance(r["conversations"], list) and r["id"] for r in first)
    assert first[0]["conversations"][0]["from"] == "human"


@pytest.fixture(scope="module")
def real_text():
    from engines.loaded_model import load_model

    lm = load_model("default", "bfloat16")
    return lm.tokenizer, lm.chat_template


def test_load_sharegpt_requests(real_text):
    tokenizer, template = real_text
    requests = load_sharegpt_requests(tokenizer, template, n=16)
    assert len(requests) == 16
    assert len({r.request_id for r in requests}) == 16
    for r in requests:
        assert r.prompt_ids == tokenizer.encode(r.prompt)
        assert r.prompt.startswith("<|im_start|>") and "<|im_start|>user\n" in r.prompt
        assert len(r.prompt_ids) <= 512
        assert 4 <= r.output_len <= 128
    assert load_sharegpt_requests(tokenizer, template, n=16) == requests
    shuffled = load_sharegpt_requests(tokenizer, template, n=16, seed=1, pool_size=64)
    assert shuffled == load_sharegpt_requests(tokenizer, template, n=16, seed=1, pool_size=64)
    assert shuffled != requests


def test_load_sharegpt_requests_limits(real_text):
    tokenizer, template = real_text
    requests = load_sharegpt_requests(tokenizer, template, n=8, max_prompt_tokens=100, max_output_tokens=16,
                                      min_output_tokens=10)
    assert len(requests) == 8
    assert all(len(r.prompt_ids) <= 100 and 10 <= r.output_len <= 16 for r in requests)


def test_left_padding():
    ids, mask = left_padded_batch([[5, 6, 7], [9]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_hf")
    write_tiny_checkpoint(path)
    return path


def _requests(lens: list[int], prompt_lens: list[int]) -> list[BenchRequest]:
    gen = torch.Generator().manual_seed(0)
    return [
        BenchRequest(f"t{i}", "", torch.randint(3, TINY_VOCAB, (p,), generator=gen).tolist(), n)
        for i, (n, p) in enumerate(zip(lens, prompt_lens))
    ]


def test_hf_static_counts_useful_and_wasted_tokens(tiny_ckpt):
    result = run_hf_static(tiny_ckpt, _requests([3, 5], [4, 7]), batch_size=2, dtype=torch.float32,
                           pad_token_id=0, progress=False)
    assert result.batch_size == 2
    assert result.output_tokens == 8
    assert result.generated_tokens == 10  # the 3-token request rides along to 5
    assert result.elapsed_s > 0 and result.output_tokens_per_s > 0
    assert 0 < result.ttft_ms["p50"] <= result.elapsed_s * 1e3
    assert set(result.tpot_ms) == {"p50", "p90", "p99"} and result.tpot_ms["p50"] > 0


def test_hf_static_several_batches(tiny_ckpt):
    lens = [4, 1, 6, 2, 3]
    requests = _requests(lens, [3, 8, 5, 2, 6])
    result = run_hf_static(tiny_ckpt, requests, batch_size=2, dtype=torch.float32, pad_token_id=0,
                           progress=False)
    assert result.output_tokens == sum(lens)
    assert result.generated_tokens == 2 * 4 + 2 * 6 + 1 * 3
    assert result.generated_tokens >= result.output_tokens
    # the last batch queued behind the others, so the slowest first token comes after the fastest
    assert result.ttft_ms["p99"] > result.ttft_ms["p50"] > 0


def test_parser_refills_across_small_chunks(tmp_path, monkeypatch):
    import bench.datasets.sharegpt as workload

    records = [_record(i) for i in range(6)]
    whole = json.dumps(records, indent=1)
    path = tmp_path / "small_chunks.json"
    path.write_text(whole[:-30])  # the last record is cut off
    monkeypatch.setattr(workload, "_CHUNK_CHARS", 7)  # every record spans several reads
    assert list(iter_sharegpt_records(path)) == records[:5]
    path.write_text(whole)
    assert list(iter_sharegpt_records(path)) == records
