"""worker/data.py: sources, tokenizer, token cache, train and held-out batches.

The builtin corpus is built once per session (a few seconds); file, directory and HF sources use small
texts written here and vocab_size=300. Batch iteration is tested on synthetic streams whose token at
position i is i, so a row's first token tells which window it is.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import worker.data as data_mod
from worker.config import DataConfig, builtin_corpus_tokens
from worker.data import (
    EOT_TOKEN,
    TokenData,
    TrainBatches,
    load_tokenizer,
    prepare_data,
    train_sequences_available,
    val_batches,
    val_windows,
)
from worker.sources import ROOTS_ENV, OutsideRoots

# ~6k chars of varied English: enough for BPE merges and a few hundred tokens of val.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A batch of sequences is split over workers before every optimizer step.",
    "Small batches add noise to the gradient, and large batches waste tokens.",
    "She read the report twice, then wrote a short note in the margin.",
    "Training loss falls quickly at first and more slowly later on.",
    "Each worker reads its own windows of the token stream, never another's.",
]


def english(n: int, offset: int = 0) -> str:
    """n lines of the sentences above with a line number, so no two lines are equal."""
    return "\n".join(f"{i}. {SENTENCES[(i + offset) % len(SENTENCES)]}" for i in range(n)) + "\n"


def split_docs(data: TokenData) -> list[str]:
    """The whole stream (train then val) decoded back into its documents (cut at eot)."""
    tok = load_tokenizer(data)
    ids = np.concatenate([np.asarray(data.train), np.asarray(data.val)]).tolist()
    docs, current = [], []
    for i in ids:
        if i == data.eot_id:
            docs.append(current)
            current = []
        else:
            current.append(i)
    docs.append(current)
    return [tok.decode(d) for d in docs]


def meta(data: TokenData) -> dict[str, Any]:
    return json.loads((data.cache_path / "meta.json").read_text())


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(scope="session")
def builtin_data(cache_root: Path) -> TokenData:
    return prepare_data(DataConfig(source="builtin", vocab_size=4096, cache_dir=str(cache_root)))


# --- builtin -------------------------------------------------------------------------------------


def test_builtin_corpus_is_real_english(builtin_data: TokenData) -> None:
    tok = load_tokenizer(builtin_data)
    text = tok.decode(np.asarray(builtin_data.train[:50_000]).tolist())
    for word in (" the ", " of ", " and ", " is ", " to "):
        assert word in text
    # prose, not random tokens or code: mostly letters and spaces, and mostly ASCII
    letters_spaces = sum(c.isascii() and (c.isalpha() or c == " ") for c in text) / len(text)
    assert letters_spaces > 0.75
    assert sum(c.isascii() for c in text) / len(text) > 0.99
    assert builtin_data.description.startswith("builtin: CPython 3.")


def test_builtin_counts(builtin_data: TokenData) -> None:
    m = meta(builtin_data)
    assert m["chars"] > 1_500_000
    assert len(builtin_data.train) == m["train_tokens"] > 300_000
    assert len(builtin_data.val) == m["val_tokens"]
    # val is the last val_fraction (0.05) of the stream
    assert m["val_tokens"] / m["tokens"] == pytest.approx(0.05, abs=1e-4)
    assert builtin_data.vocab_size == 4096  # 2M chars of English easily fill the requested vocabulary
    assert builtin_data.train.dtype == np.uint16 and isinstance(builtin_data.train, np.memmap)
    assert int(np.asarray(builtin_data.train).max()) < builtin_data.vocab_size
    # one eot between consecutive documents, none elsewhere
    n_eot = int((np.asarray(builtin_data.train) == builtin_data.eot_id).sum())
    n_eot += int((np.asarray(builtin_data.val) == builtin_data.eot_id).sum())
    assert n_eot == m["documents"] - 1


def test_builtin_tokenizer_round_trips_and_compresses(builtin_data: TokenData) -> None:
    tok = load_tokenizer(builtin_data)
    sentence = "The function returns a new list containing the sorted items — naïve café 日本."
    ids = tok.encode(sentence).ids
    assert tok.decode(ids) == sentence
    # learned merges: common English words are one token, so far fewer tokens than characters
    assert len(tok.encode("The function returns the value of the argument.").ids) < 15
    assert tok.token_to_id(EOT_TOKEN) == builtin_data.eot_id
    assert tok.get_vocab_size() == builtin_data.vocab_size


# --- local sources ---------------------------------------------------------------------------------


def test_text_file_source(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    text = english(120)
    path.write_text(text)
    data = prepare_data(DataConfig(source=str(path), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    # one file is one document: no eot anywhere, and the stream decodes back to the exact text
    assert split_docs(data) == [text]
    assert data.vocab_size <= 300
    assert data.description.startswith(f"file: {path.resolve()}")
    assert len(data.val) == round((len(data.train) + len(data.val)) * 0.05)


def test_directory_source_reads_txt_and_md_sorted(tmp_path: Path) -> None:
    src = tmp_path / "docs"
    (src / "sub").mkdir(parents=True)
    (src / ".hidden").mkdir()
    (src / "b.txt").write_text(english(40, offset=1))
    (src / "sub" / "a.md").write_text(english(40, offset=2))
    (src / "a.txt").write_text(english(40, offset=3))
    (src / "skip.py").write_text("NOT_A_DOCUMENT = 1\n")
    (src / ".hidden" / "c.txt").write_text("HIDDEN_TEXT\n")
    data = prepare_data(DataConfig(source=str(src), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    # rule: *.txt/*.md recursively, sorted by relative path, one document each, eot between them
    assert split_docs(data) == [english(40, offset=3), english(40, offset=1), english(40, offset=2)]
    assert data.description.startswith(f"dir: {src.resolve()} (3 files)")


def test_missing_path_error_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-corpus.txt"
    with pytest.raises(FileNotFoundError, match="no-such-corpus.txt"):
        prepare_data(DataConfig(source=str(missing), cache_dir=str(tmp_path / "cache")))


def test_empty_corpus_errors_name_source(tmp_path: Path) -> None:
    empty_dir = tmp_path / "empty-dir"
    empty_dir.mkdir()
    (empty_dir / "notes.py").write_text("x = 1\n")  # not a text file: the directory holds no corpus
    with pytest.raises(ValueError, match="empty-dir"):
        prepare_data(DataConfig(source=str(empty_dir), cache_dir=str(tmp_path / "cache")))
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n\n")
    with pytest.raises(ValueError, match="empty corpus.*blank.txt"):
        prepare_data(DataConfig(source=str(blank), cache_dir=str(tmp_path / "cache")))
    # a failed build leaves no cache folder behind, only the lock file
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


# --- HuggingFace datasets --------------------------------------------------------------------------


def test_hf_dataset_saved_to_disk(tmp_path: Path) -> None:
    import datasets

    texts = [english(30, offset=k) for k in range(4)]
    saved = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": texts, "label": [0, 1, 0, 1]}).save_to_disk(str(saved))
    data = prepare_data(DataConfig(source=f"hf:{saved}", vocab_size=300, cache_dir=str(tmp_path / "cache")))
    assert split_docs(data) == texts  # rows in order, one document each
    assert data.description.startswith(f"hf: {saved.resolve()}")


def test_hf_dataset_dict_takes_train_split(tmp_path: Path) -> None:
    import datasets

    train, test = [english(30), english(30, offset=2)], ["TEST SPLIT TEXT " * 20]
    saved = tmp_path / "dsd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"body": train}), "test": datasets.Dataset.from_dict({"body": test})}
    ).save_to_disk(str(saved))
    data = prepare_data(
        DataConfig(source=f"hf:{saved}", text_field="body", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    )
    assert split_docs(data) == train


def test_hf_wrong_text_field_lists_columns(tmp_path: Path) -> None:
    import datasets

    saved = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": [english(10)], "label": [0]}).save_to_disk(str(saved))
    cfg = DataConfig(source=f"hf:{saved}", text_field="content", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="no column 'content'; columns: text, label"):
        prepare_data(cfg)


def test_hf_hub_name_goes_to_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import huggingface_hub.constants

    # No network here: offline mode makes load_dataset fail at once instead of retrying for ~20 s.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    source = "hf:batchsweep-no-such-user/no-such-dataset:cfg1"
    with pytest.raises(ConnectionError, match="no-such-dataset") as info:
        prepare_data(DataConfig(source=source, cache_dir=str(tmp_path / "cache")))
    # the error carries a note naming the source, dataset and config we asked for
    assert any(source in note and "'cfg1'" in note for note in info.value.__notes__)


# --- cache -----------------------------------------------------------------------------------------


def test_second_call_loads_without_rebuilding(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(english(100))
    cfg = DataConfig(source=str(path), vocab_size=300, cache_dir=str(tmp_path / "cache"))
    builds = data_mod._BUILD_COUNT
    first = prepare_data(cfg)
    stamp = (first.cache_path / "train.bin").stat().st_mtime_ns
    second = prepare_data(cfg)
    assert data_mod._BUILD_COUNT == builds + 1
    assert second.cache_path == first.cache_path
    assert (second.cache_path / "train.bin").stat().st_mtime_ns == stamp
    assert meta(second)["build_id"] == meta(first)["build_id"]
    assert np.array_equal(second.train, first.train)
    assert sorted(p.name for p in first.cache_path.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]

    # the key covers vocab_size and the file's size/mtime: either change gives a new cache
    other_vocab = prepare_data(cfg.model_copy(update={"vocab_size": 320}))
    assert other_vocab.cache_path != first.cache_path
    path.write_text(english(100, offset=1) + "more text\n")
    changed = prepare_data(cfg)
    assert changed.cache_path != first.cache_path
    assert data_mod._BUILD_COUNT == builds + 3


def test_cache_root_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(english(60))
    monkeypatch.setenv("BATCHSWEEP_CACHE", str(tmp_path / "env-cache"))
    data = prepare_data(DataConfig(source=str(path), vocab_size=300))
    assert data.cache_path.parent == tmp_path / "env-cache"


def _prepare_in_child(cfg_json: str, barrier: Any, results: Any) -> None:
    """Runs in a child process: wait for the sibling, then both call prepare_data at once."""
    cfg = DataConfig.model_validate_json(cfg_json)
    builds = data_mod._BUILD_COUNT  # a forked child starts with the parent's count
    barrier.wait(timeout=60)
    try:
        data = prepare_data(cfg)
        m = meta(data)
        checksum = int(np.asarray(data.train).sum())
        results.put((data_mod._BUILD_COUNT - builds, m["build_id"], str(data.cache_path), checksum))
    except BaseException as exc:  # report instead of leaving the parent waiting on the queue
        results.put(("error", repr(exc)))
        raise


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(english(3000))  # ~200k chars: the build takes long enough for the two to overlap
    cfg = DataConfig(source=str(path), vocab_size=1000, cache_dir=str(tmp_path / "cache"))
    # fork: two separate processes (own file descriptors, so the file lock really arbitrates) without
    # the ~4 s each a spawned interpreter needs to import torch; the children use no torch or OpenMP.
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_child, args=(cfg.model_dump_json(), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(r[0] != "error" for r in out), out
    # exactly one of the two processes built; both loaded that build
    assert sorted(built for built, *_ in out) == [0, 1]
    assert out[0][1:] == out[1][1:]
    cache = tmp_path / "cache"
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [Path(out[0][2]).name]
    # and this process loads the same cache without building
    builds = data_mod._BUILD_COUNT
    assert meta(prepare_data(cfg))["build_id"] == out[0][1]
    assert data_mod._BUILD_COUNT == builds


# --- train batches ---------------------------------------------------------------------------------


def synthetic(n_train: int, n_val: int = 100) -> TokenData:
    """Token i of train is i (and of val, 60000 + i): a row's first token locates its window."""
    return TokenData(
        train=np.arange(n_train, dtype=np.uint16),
        val=np.arange(60_000, 60_000 + n_val, dtype=np.uint16),
        vocab_size=65_535,
        eot_id=0,
        cache_path=Path("/nonexistent"),
        description="synthetic",
    )


def window_ids(x: torch.Tensor, seq_len: int) -> list[int]:
    return (x[:, 0] // (seq_len + 1)).tolist()


def take(batches: TrainBatches, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [next(batches) for _ in range(n)]


def test_train_sequences_available() -> None:
    # non-overlapping windows of seq_len + 1 tokens; a partial window at the end does not count
    assert train_sequences_available(synthetic(1000), seq_len=9) == 100
    assert train_sequences_available(synthetic(999), seq_len=9) == 99


def test_batches_shapes_and_shift() -> None:
    seq_len = 7
    x, y = next(TrainBatches(synthetic(800), seq_len=seq_len, micro_batch=4))
    assert x.shape == y.shape == (4, seq_len)
    assert x.dtype == y.dtype == torch.int64
    # y is x shifted by one token: y[:, t] is the token after x[:, t]
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    # each row is one whole window starting at a multiple of seq_len + 1
    assert torch.equal(x[:, 0] % (seq_len + 1), torch.zeros(4, dtype=torch.int64))
    assert torch.equal(x - x[:, :1], torch.arange(seq_len).expand(4, seq_len))


def test_batches_are_deterministic_per_seed() -> None:
    data = synthetic(8000)

    def run(seed):
        return [window_ids(x, 7) for x, _ in take(TrainBatches(data, seq_len=7, micro_batch=4, seed=seed), 20)]

    assert run(0) == run(0)
    assert run(0) != run(1)
    # shuffled: not the stream order
    assert run(0)[0] != [0, 1, 2, 3]


def test_ranks_see_disjoint_windows_that_cover_the_epoch() -> None:
    data, seq_len = synthetic(8000), 7  # 1000 windows
    seen = []
    for rank in range(2):
        it = TrainBatches(data, seq_len=seq_len, micro_batch=5, rank=rank, world_size=2, seed=3)
        assert it.batches_per_epoch == 100
        seen.append([w for x, _ in take(it, it.batches_per_epoch) for w in window_ids(x, seq_len)])
        assert it.epoch == 0
    # within an epoch no window repeats on a rank, no window is on both ranks, and together they cover all
    assert len(set(seen[0])) == len(seen[0]) == 500
    assert not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(range(1000))


def test_epoch_increments_with_a_fresh_permutation() -> None:
    data, seq_len = synthetic(8 * 103), 7  # 103 windows, 25 batches of 4: 3 windows left out per epoch
    it = TrainBatches(data, seq_len=seq_len, micro_batch=4, seed=0)
    assert it.batches_per_epoch == 25
    first = [w for x, _ in take(it, 25) for w in window_ids(x, seq_len)]
    assert it.epoch == 0  # epoch is the epoch of the last batch returned
    second = [w for x, _ in take(it, 25) for w in window_ids(x, seq_len)]
    assert it.epoch == 1
    next(it)
    assert it.epoch == 2
    assert len(set(first)) == len(set(second)) == 100
    assert first != second  # reshuffled, seeded by (seed, epoch)


def test_state_dict_resumes_exactly_across_epochs() -> None:
    data, seq_len = synthetic(8 * 40), 7  # 40 windows: 5 batches of 4 per rank per epoch at world_size 2
    ref = TrainBatches(data, seq_len=seq_len, micro_batch=4, rank=1, world_size=2, seed=7)
    take(ref, 3)
    # the state holds no rank: rank 0's checkpoint restores rank 1 as well
    rank0 = TrainBatches(data, seq_len=seq_len, micro_batch=4, rank=0, world_size=2, seed=7)
    take(rank0, 3)
    state = rank0.state_dict()
    assert state["epoch"] == 0 and state["position"] == 3
    resumed = TrainBatches(data, seq_len=seq_len, micro_batch=4, rank=1, world_size=2, seed=7)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON round trip
    for (x_ref, y_ref), (x, y) in zip(take(ref, 12), take(resumed, 12), strict=True):  # crosses two epochs
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert resumed.epoch == ref.epoch == 2
    assert resumed.state_dict() == ref.state_dict()


def test_state_dict_refuses_other_settings() -> None:
    data = synthetic(8 * 40)
    state = TrainBatches(data, seq_len=7, micro_batch=4, world_size=2, seed=7).state_dict()
    with pytest.raises(ValueError, match="world_size=2"):
        TrainBatches(data, seq_len=7, micro_batch=4, world_size=1, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=7"):
        TrainBatches(data, seq_len=7, micro_batch=4, world_size=2, seed=8).load_state_dict(state)


def test_too_little_train_data_is_refused() -> None:
    # 10 windows cannot fill one batch of 4 on each of 3 ranks
    with pytest.raises(ValueError, match="10 windows"):
        TrainBatches(synthetic(80), seq_len=7, micro_batch=4, rank=0, world_size=3)


def test_batches_on_builtin_data(builtin_data: TokenData) -> None:
    it = TrainBatches(builtin_data, seq_len=128, micro_batch=4, seed=0)
    assert it.n_windows == train_sequences_available(builtin_data, 128) == len(builtin_data.train) // 129
    x, y = next(it)
    assert x.shape == (4, 128) and int(x.max()) < builtin_data.vocab_size
    assert torch.equal(y[:, :-1], x[:, 1:])


# --- val batches -----------------------------------------------------------------------------------


def test_val_windows_are_the_first_windows_in_order_in_batches_of_any_size() -> None:
    data = synthetic(800, n_val=200)  # 25 val windows of 8
    windows = val_windows(data, seq_len=7, tokens=12 * 7)  # 12 windows x 7 scored tokens
    assert windows.tolist() == list(range(12))
    for micro_batch, sizes in ((4, [4, 4, 4]), (5, [5, 5, 2]), (12, [12]), (100, [12])):
        got = list(val_batches(data, windows, seq_len=7, micro_batch=micro_batch))
        assert [x.shape[0] for x, _ in got] == sizes
        # the same windows, in order, however they are batched
        assert [w for x, _ in got for w in window_ids(x - 60_000, 7)] == list(range(12))
        assert all(torch.equal(y[:, :-1], x[:, 1:]) for x, y in got)


def test_val_windows_round_tokens_up_to_whole_windows() -> None:
    data = synthetic(800, n_val=200)
    assert len(val_windows(data, seq_len=7, tokens=1)) == 1
    assert len(val_windows(data, seq_len=7, tokens=15)) == 3  # at least 15 scored tokens: 3 x 7
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        val_windows(data, seq_len=7, tokens=0)


def test_val_windows_fixed_across_calls_and_training(builtin_data: TokenData) -> None:
    a = val_windows(builtin_data, seq_len=64, tokens=512)
    take(TrainBatches(builtin_data, seq_len=64, micro_batch=4, seed=5), 3)  # training does not move them
    b = val_windows(builtin_data, seq_len=64, tokens=512)
    assert a.tolist() == b.tolist() == list(range(8))
    (x, _), *_ = val_batches(builtin_data, a, seq_len=64, micro_batch=4)
    assert torch.equal(x[0], torch.from_numpy(np.asarray(builtin_data.val[:64], dtype=np.int64)))


def test_short_val_gives_all_its_windows_and_empty_val_is_an_error() -> None:
    # more tokens than val holds: all 6 of its windows
    assert val_windows(synthetic(800, n_val=50), seq_len=7, tokens=1_000).tolist() == list(range(6))
    with pytest.raises(ValueError, match="fewer than one window"):
        val_windows(synthetic(800, n_val=7), seq_len=7, tokens=7)


def test_peek_returns_the_next_batches_without_moving_on() -> None:
    data, seq_len = synthetic(8 * 40), 7  # 40 windows: 10 batches of 4 per epoch
    it = TrainBatches(data, seq_len=seq_len, micro_batch=4, seed=3)
    take(it, 8)
    state = it.state_dict()
    peeked = list(it.peek(4))  # crosses into epoch 1
    assert it.state_dict() == state and it.epoch == 0
    for (xp, yp), (x, y) in zip(peeked, take(it, 4), strict=True):
        assert torch.equal(xp, x) and torch.equal(yp, y)
    assert it.epoch == 1


# --- data roots (SWEEPS_DATA_ROOTS: a driver the service launched) ---------------------------------


@pytest.fixture
def rooted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    inside, outside = tmp_path / "corpora", tmp_path / "private"
    (inside / "books").mkdir(parents=True)
    (inside / "books" / "a.txt").write_text(english(60))
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET " * 100)
    monkeypatch.setenv(ROOTS_ENV, str(inside))
    return inside, outside


def test_files_inside_the_roots_are_read(rooted: tuple[Path, Path], tmp_path: Path) -> None:
    inside, _ = rooted
    data = prepare_data(DataConfig(source=str(inside / "books"), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    assert split_docs(data) == [english(60)]


def test_a_symlinked_file_pointing_outside_the_roots_is_never_read(rooted: tuple[Path, Path], tmp_path: Path) -> None:
    inside, outside = rooted
    os.symlink(outside / "secret.txt", inside / "books" / "b.txt")
    with pytest.raises(OutsideRoots, match="'b.txt'.*outside the allowed data roots"):
        prepare_data(DataConfig(source=str(inside / "books"), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    with pytest.raises(OutsideRoots):
        prepare_data(DataConfig(source=str(inside / "books" / "b.txt"), cache_dir=str(tmp_path / "cache")))


def test_a_link_swapped_after_listing_is_caught_at_read(rooted: tuple[Path, Path]) -> None:
    inside, outside = rooted
    link = inside / "books" / "b.txt"
    os.symlink(inside / "books" / "a.txt", link)  # inside when the folder is listed
    corpus = data_mod._local_corpus(str(inside / "books"))
    link.unlink()
    os.symlink(outside / "secret.txt", link)  # outside when it is read
    with pytest.raises(OutsideRoots):
        list(corpus.documents())


def test_outside_the_roots_the_error_does_not_say_whether_the_path_exists(rooted: tuple[Path, Path]) -> None:
    _, outside = rooted
    messages = []
    for name in ("secret.txt", "missing.txt"):
        with pytest.raises(OutsideRoots) as info:
            data_mod._local_corpus(str(outside / name))
        messages.append(str(info.value).replace(name, "<name>"))
    assert messages[0] == messages[1]


def test_without_roots_every_path_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    (tmp_path / "x.txt").write_text(english(60))
    data = prepare_data(DataConfig(source=str(tmp_path / "x.txt"), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    assert split_docs(data) == [english(60)]


def test_builtin_token_table_matches_the_corpus(builtin_data: TokenData) -> None:
    # validation compares seq_len with BUILTIN_CORPUS_TOKENS instead of tokenising; it must stay true
    measured = meta(builtin_data)["tokens"]
    assert measured == pytest.approx(builtin_corpus_tokens(4096), rel=0.05)
