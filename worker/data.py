"""Text sources -> offline byte-level BPE -> memory-mapped token cache -> training and held-out batches.

A source (`DataConfig.source`) is one of

* ``"builtin"``: English text that ships with CPython, so a run needs no download: the pydoc topic
  pages (`pydoc_data.topics`) plus the docstrings of the standard library, read with `ast` from the
  ``.py`` sources (the modules are never imported; tests and IDLE are left out);
* a local text file, or a directory whose ``*.txt`` / ``*.md`` files are read (recursive, sorted);
  with ``SWEEPS_DATA_ROOTS`` set (a driver the service launched), every file read must resolve inside
  one of those folders (worker/sources.py), checked again at the moment it is read;
* ``"hf:<dataset>[:<config>]"``: a HuggingFace dataset, from a directory saved with ``save_to_disk``
  or by name with ``datasets.load_dataset`` (column ``DataConfig.text_field``, split "train").

`prepare_data` trains a byte-level BPE tokenizer on the corpus, encodes it with an end-of-text token
between documents, and stores the token stream once per (source, vocab size, val fraction) under the
cache directory::

    <cache root>/<kind>-v<vocab>-<key>/
        tokenizer.json   the trained tokenizer (`tokenizers.Tokenizer.from_file`)
        train.bin        uint16 tokens, raw little-endian, the first (1 - val_fraction) of the stream
        val.bin          uint16 tokens, the last val_fraction of the stream (fixed, seed-independent)
        meta.json        counts, source description, vocabulary size, the identity hashed into <key>

The folder is built by one process under a file lock, in a temporary folder renamed into place when
complete, so any number of workers may call `prepare_data` at once; later calls only map the files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import filelock
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from worker.config import DataConfig
from worker.settings import WorkerSettings
from worker.sources import ROOTS_ENV, OutsideRoots, all_files, is_inside, outside, roots_from_env, text_files

if TYPE_CHECKING:
    import torch  # batches are torch tensors; preparing the data (what a sweep's driver does) needs no torch

logger = logging.getLogger(__name__)

# Bump when anything that changes the cached bytes changes (extraction, tokenizer recipe, file layout):
# it is part of the cache key, so old caches are simply not found again.
FORMAT_VERSION = 1
EOT_TOKEN = "<|endoftext|>"

TOKEN_DTYPE = np.dtype("<u2")  # uint16: DataConfig caps vocab_size at 65535
_TOKEN_BYTES = TOKEN_DTYPE.itemsize
_ENCODE_CHUNK = 512  # documents per encode_batch call: bounds memory on large corpora, keeps Rust threads busy
_DOC_SEPARATOR = "\n\n"  # joins the docstrings of one module into one document

# Standard-library folders that are not prose for our purpose: test suites (mostly code and fixtures),
# IDLE, installed third-party packages, and pydoc_data (its topics are read directly, not parsed).
_STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}
)

# Number of caches this process has built (tests check that a cache is built once, not per call).
_BUILD_COUNT = 0


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # eq=False: arrays do not compare (or hash) as a single truth value
class TokenData:
    """A prepared corpus: memory-mapped token streams plus what a model needs to know about them."""

    train: np.ndarray  # uint16 memmap, 1-D token stream (documents separated by eot_id)
    val: np.ndarray  # uint16 memmap, 1-D, the held-out tail of the same stream
    vocab_size: int  # the tokenizer's real vocabulary size (<= DataConfig.vocab_size)
    eot_id: int  # id of EOT_TOKEN, placed between documents
    cache_path: Path  # folder holding tokenizer.json, train.bin, val.bin, meta.json
    description: str  # human-readable source, e.g. "builtin: CPython 3.11 docs (2.1M chars)"


def prepare_data(cfg: DataConfig) -> TokenData:
    """Return the token cache for `cfg`, building it first if no process has yet.

    Raises FileNotFoundError for a local source that does not exist, ValueError for an empty corpus
    or an HF dataset without `cfg.text_field`; errors of `datasets.load_dataset` pass through with a
    note naming the source.
    """
    corpus = _resolve_source(cfg)
    root = _cache_root(cfg)
    final = root / f"{corpus.kind}-v{cfg.vocab_size}-{_cache_key(corpus, cfg)}"
    if not (final / "meta.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(root / f".{final.name}.lock"))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            logger.info("another process is building %s; waiting for it", final)
            lock.acquire()
        try:
            # Re-check under the lock: the process we waited for has usually built it already.
            if not (final / "meta.json").exists():
                _build_locked(corpus, cfg, final)
        finally:
            lock.release()
    return _load(final)


def load_tokenizer(data: TokenData) -> tokenizers.Tokenizer:
    """The tokenizer that produced `data` (decode ids with `.decode(ids)`, encode with `.encode(text).ids`)."""
    return tokenizers.Tokenizer.from_file(str(data.cache_path / "tokenizer.json"))


def train_sequences_available(data: TokenData, seq_len: int) -> int:
    """Non-overlapping windows of seq_len + 1 tokens (one sequence plus its shifted target) in train."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got seq_len={seq_len}")
    return len(data.train) // (seq_len + 1)


class TrainBatches:
    """Deterministic, resumable iterator of (x, y) int64 tensors of shape (micro_batch, seq_len), for one rank.

    The train stream is cut into non-overlapping windows of seq_len + 1 tokens; y is x shifted by one
    token. Each epoch shuffles the window order with a numpy Generator seeded by (seed, epoch) and deals
    the windows to ranks round-robin (rank r of world w takes every w-th window), so no two ranks see
    the same window in one epoch. Every rank gets the same number of batches per epoch (the few
    windows that do not fill a batch on every rank are skipped), so data-parallel ranks stay in
    lockstep. When an epoch is used up the next batch starts a new epoch with a fresh permutation;
    `epoch` is the (0-based) epoch of the last batch returned.

    `state_dict()` holds no rank, so rank 0's copy restores every rank of the same world size.
    """

    def __init__(
        self,
        data: TokenData,
        *,
        seq_len: int,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got micro_batch={micro_batch}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.n_windows = train_sequences_available(data, seq_len)
        self.windows_per_rank = self.n_windows // world_size  # per epoch; equal on every rank
        self.batches_per_epoch = self.windows_per_rank // micro_batch
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"train holds {len(data.train)} tokens = {self.n_windows} windows of seq_len+1={seq_len + 1}, "
                f"fewer than micro_batch={micro_batch} x world_size={world_size}; use a larger corpus "
                f"or a smaller seq_len/micro_batch"
            )
        self._train = data.train
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self._position = 0  # batches already returned in the current epoch
        self._order = self._rank_windows(0)

    def _rank_windows(self, epoch: int) -> np.ndarray:
        """Window indices this rank reads in `epoch`, in order: shape (batches_per_epoch * micro_batch,)."""
        # SeedSequence wants non-negative entropy; the modulo keeps negative seeds usable and distinct.
        rng = np.random.default_rng([self.seed % 2**64, epoch])
        perm = rng.permutation(self.n_windows)
        # Trim to a multiple of world_size first, so the round-robin deal gives every rank equal shares.
        mine = perm[: self.windows_per_rank * self.world_size][self.rank :: self.world_size]
        return mine[: self.batches_per_epoch * self.micro_batch]

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._position == self.batches_per_epoch:
            self.epoch += 1
            self._position = 0
            self._order = self._rank_windows(self.epoch)
            logger.info("rank %d: train data used up, starting epoch %d", self.rank, self.epoch)
        windows = self._order[self._position * self.micro_batch : (self._position + 1) * self.micro_batch]
        self._position += 1
        return _gather(self._train, windows, self.seq_len)

    def peek(self, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The next `n` batches, read one at a time, without moving on: the next `n` calls of `next` return
        the same batches. Sophia-G's Hessian pass runs on the next step's inputs (worker/loop.py); the
        iterator's state, and so a checkpoint taken meanwhile, is untouched."""
        return self._batches_from(self.epoch, self._position, self._order, n)

    def _batches_from(
        self, epoch: int, position: int, order: np.ndarray, n: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(n):
            if position == self.batches_per_epoch:
                epoch, position = epoch + 1, 0
                order = self._rank_windows(epoch)
            yield _gather(
                self._train, order[position * self.micro_batch : (position + 1) * self.micro_batch], self.seq_len
            )
            position += 1

    def state_dict(self) -> dict[str, int]:
        """Epoch and position for checkpoint resume, plus the settings they are only valid for."""
        return {
            "epoch": self.epoch,
            "position": self._position,  # batches already returned in `epoch`
            "seed": self.seed,
            "world_size": self.world_size,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "n_windows": self.n_windows,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue exactly after the last batch of the iterator that produced `state`."""
        for key in ("seed", "world_size", "seq_len", "micro_batch", "n_windows"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume batches: checkpoint has {key}={state[key]}, this run has {key}={getattr(self, key)}"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.batches_per_epoch:
            raise ValueError(
                f"cannot resume batches: epoch={epoch}, position={position} outside "
                f"0..{self.batches_per_epoch} batches per epoch"
            )
        self.epoch, self._position = epoch, position
        self._order = self._rank_windows(epoch)


def val_windows(data: TokenData, *, seq_len: int, tokens: int) -> np.ndarray:
    """The fixed held-out set: indices of the first ceil(tokens / seq_len) non-overlapping windows of val
    (seq_len + 1 tokens each, seq_len of them scored), in order: shape (n,).

    Independent of seed, rank, micro-batch size and worker count (`TrainConfig.evaluation.tokens` sets `tokens`).
    If val is shorter, all its windows are used; a val split without a single window is an error.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got tokens={tokens}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got seq_len={seq_len}")
    available = len(data.val) // (seq_len + 1)
    if available == 0:
        raise ValueError(
            f"val split of {data.description} holds {len(data.val)} tokens, fewer than one window of "
            f"seq_len+1={seq_len + 1}; use a larger corpus, a larger val_fraction or a smaller seq_len"
        )
    wanted = -(-tokens // seq_len)  # ceil: at least `tokens` scored tokens
    if wanted > available:
        logger.info(
            "val split holds %d windows of %d tokens (%d scored tokens): evaluating on all of it, "
            "fewer than evaluation.tokens=%d",
            available,
            seq_len + 1,
            available * seq_len,
            tokens,
        )
    return np.arange(min(wanted, available))


def val_batches(
    data: TokenData, windows: np.ndarray, *, seq_len: int, micro_batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) int64 batches of `windows` of val, in order, `micro_batch` rows each (the last may hold fewer):
    read from the memory map one batch at a time, so the held-out set costs no memory between evals."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got micro_batch={micro_batch}")
    for i in range(0, len(windows), micro_batch):
        yield _gather(data.val, windows[i : i + micro_batch], seq_len)


def _gather(stream: np.ndarray, windows: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows stream[w*(seq_len+1) : (w+1)*(seq_len+1)] for each window w -> (x, y), each (len(windows), seq_len)."""
    import torch  # here, not at the top: a sweep's driver prepares the data without it (~1.3 s of import)

    offsets = windows.astype(np.int64)[:, None] * (seq_len + 1) + np.arange(seq_len + 1)  # (B, seq_len+1)
    rows = torch.from_numpy(np.asarray(stream[offsets], dtype=np.int64))  # one read from the memmap
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# --------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Corpus:
    """A resolved source: cheap to make (no text read yet), re-iterable when built."""

    kind: str  # "builtin" | "file" | "dir" | "hf": first part of the cache folder name
    identity: dict[str, Any]  # JSON-able; hashed into the cache key, so it must change when the text can
    label: str  # description without the size, e.g. "builtin: CPython 3.11 docs"
    documents: Callable[[], Iterator[str]]  # called twice (tokenizer training, encoding); same order both times


def _resolve_source(cfg: DataConfig) -> _Corpus:
    source = cfg.source
    if source == "builtin":
        return _builtin_corpus()
    if source.startswith("hf:"):
        return _hf_corpus(source, cfg.text_field)
    return _local_corpus(source)


def _builtin_corpus() -> _Corpus:
    version = f"{platform.python_implementation()} {platform.python_version()}"
    docs: list[str] = []  # filled on first use: parsing the stdlib takes seconds, a cache hit needs none of it

    def documents() -> Iterator[str]:
        if not docs:
            docs.extend(_builtin_documents())
        return iter(docs)

    return _Corpus(
        kind="builtin",
        identity={"kind": "builtin", "python": version, "stdlib": sysconfig.get_paths()["stdlib"]},
        label=f"builtin: CPython {sys.version_info.major}.{sys.version_info.minor} docs",
        documents=documents,
    )


def _builtin_documents() -> list[str]:
    """pydoc topic pages (one document each), then each stdlib module's docstrings (one document per module)."""
    from pydoc_data.topics import topics  # ~465k chars of the language reference, as plain text

    docs = [topics[name] for name in sorted(topics)]
    for path in _stdlib_sources():
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError) as exc:  # e.g. a deliberately broken file; not prose anyway
            logger.debug("builtin corpus: skipping %s (%s)", path, exc)
            continue
        strings: list[str] = []
        _collect_docstrings(tree, strings)
        if strings:
            docs.append(_DOC_SEPARATOR.join(strings))
    return docs


def _stdlib_sources() -> list[Path]:
    """The standard library's .py files minus _STDLIB_EXCLUDED_DIRS, sorted by path (deterministic order)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into site-packages (large) or test suites.
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS and not d.startswith(".")]
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _collect_docstrings(node: ast.AST, out: list[str]) -> None:
    """Docstrings of `node` and of every class/function defined in it, in source order.

    Walks statement bodies only (not expressions), which is several times faster than ast.walk and
    still reaches definitions nested in if/try/with/for blocks.
    """
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node, clean=True)  # clean: common indentation removed
        if doc and doc.strip():
            out.append(doc.strip())
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        children = getattr(node, field, None)
        if isinstance(children, list):
            for child in children:
                if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                    _collect_docstrings(child, out)


def _local_corpus(source: str) -> _Corpus:
    roots = roots_from_env()
    path = Path(source).expanduser()
    # the roots first: outside them, the same error whether the path exists or not
    if roots is not None and not is_inside(path, roots):
        raise OutsideRoots(f"data source {source!r} is outside the allowed data roots ({ROOTS_ENV})")
    if not path.exists():
        raise FileNotFoundError(f"data source {source!r} does not exist (resolved to {path.resolve()})")
    path = path.resolve()
    if path.is_dir():
        files = text_files(path, roots)  # .txt/.md, hidden parts (.git, .venv, ...) skipped, sorted
        if not files:
            raise ValueError(f"empty corpus: data source {source!r} holds no *.txt or *.md files")
        kind, label = "dir", f"dir: {path} ({len(files)} files)"
    else:
        files = [path]
        kind, label = "file", f"file: {path}"

    def documents() -> Iterator[str]:
        for f in files:
            real = f.resolve()  # what is read; checked again here, as a link may have changed since
            if roots is not None and not is_inside(real, roots):
                raise outside(f, path)
            yield real.read_text(encoding="utf-8", errors="replace")  # one file = one document

    return _Corpus(
        kind=kind,
        identity={"kind": kind, "path": str(path), "files": [_file_stamp(f, path) for f in files]},
        label=label,
        documents=documents,
    )


def _file_stamp(f: Path, root: Path) -> list[Any]:
    """(relative path, size, mtime) of a file: changes whenever its contents plausibly do."""
    st = f.stat()
    rel = f.relative_to(root).as_posix() if f != root else f.name
    return [rel, st.st_size, st.st_mtime_ns]


def _parse_hf(source: str) -> tuple[str, str | None]:
    """'hf:<dataset>[:<config>]' -> (dataset, config); a path that exists is taken whole (it may hold ':')."""
    rest = source[len("hf:") :]
    if Path(rest).expanduser().exists():
        return rest, None
    name, sep, config = rest.partition(":")
    if not name:
        raise ValueError(f"hf: source needs a dataset name, got source={source!r}")
    return name, (config or None) if sep else None


def _hf_corpus(source: str, text_field: str) -> _Corpus:
    name, config = _parse_hf(source)
    local = Path(name).expanduser()
    roots = roots_from_env()
    if roots is not None and local.is_absolute() and not is_inside(local, roots):
        raise OutsideRoots(f"data source {source!r} is outside the allowed data roots ({ROOTS_ENV})")
    if local.is_dir():
        if roots is not None:
            for f in all_files(local):
                if not is_inside(f, roots):
                    raise outside(f, local)
        if config is not None:
            raise ValueError(f"source {source!r}: a dataset saved on disk takes no config, got config={config!r}")
        local = local.resolve()
        identity: dict[str, Any] = {
            "kind": "hf",
            "path": str(local),
            "text_field": text_field,
            "fingerprints": _saved_fingerprints(local),
            "files": [_file_stamp(f, local) for f in sorted(local.rglob("*")) if f.is_file()],
        }
        label = f"hf: {local} [{text_field}]"
    else:
        # A Hub dataset is keyed by name and config only: resolving its revision would need the network,
        # and a cache hit must not. Delete the cache folder to pick up a new revision.
        identity = {"kind": "hf", "name": name, "config": config, "text_field": text_field}
        label = f"hf: {name}{':' + config if config else ''} [{text_field}]"

    def documents() -> Iterator[str]:
        dataset = _load_hf_train(source, name, config, local if local.is_dir() else None)
        if text_field not in dataset.column_names:
            raise ValueError(
                f"source {source!r} has no column {text_field!r}; columns: {', '.join(dataset.column_names)}"
            )
        column = dataset.select_columns([text_field])
        for batch in column.iter(batch_size=1000):  # Arrow batches: the column never sits in memory whole
            for i, text in enumerate(batch[text_field]):
                if text is None:
                    continue
                if not isinstance(text, str):
                    raise ValueError(
                        f"source {source!r}: column {text_field!r} holds {type(text).__name__} values "
                        f"(row {i} of a batch), not text"
                    )
                yield text

    return _Corpus(kind="hf", identity=identity, label=label, documents=documents)


def _saved_fingerprints(folder: Path) -> list[str]:
    """`_fingerprint` of each dataset saved under `folder` (state.json files of save_to_disk), sorted by path."""
    prints: list[str] = []
    for state in sorted(folder.rglob("state.json")):
        try:
            prints.append(str(json.loads(state.read_text()).get("_fingerprint")))
        except (OSError, ValueError):
            continue
    return prints


def _load_hf_train(source: str, name: str, config: str | None, local: Path | None) -> Any:
    """The "train" split of a DatasetDict, or the Dataset itself."""
    import datasets  # imported here: ~2 s, and only hf: sources need it

    if local is not None:
        loaded = datasets.load_from_disk(str(local))
    else:
        try:
            loaded = datasets.load_dataset(name, config)
        except Exception as exc:
            exc.add_note(f"while loading data source {source!r} (dataset={name!r}, config={config!r})")
            raise
    if isinstance(loaded, (datasets.DatasetDict, dict)):
        if "train" not in loaded:
            raise ValueError(f"source {source!r} has no 'train' split; splits: {', '.join(loaded)}")
        loaded = loaded["train"]
    if not isinstance(loaded, datasets.Dataset):
        raise ValueError(f"source {source!r} loaded as {type(loaded).__name__}, expected a datasets.Dataset")
    return loaded


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------


def _cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else WorkerSettings().cache_root


def _cache_key(corpus: _Corpus, cfg: DataConfig) -> str:
    keyed = {
        "format": FORMAT_VERSION,
        "source": corpus.identity,
        "vocab_size": cfg.vocab_size,
        "val_fraction": cfg.val_fraction,
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def _build_locked(corpus: _Corpus, cfg: DataConfig, final: Path) -> None:
    """Build into a fresh temporary folder next to `final`, then rename it into place. Caller holds the lock."""
    root = final.parent
    # Leftovers of a builder that died: only one builder runs (we hold the lock), so none is in use.
    for stale in root.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists():  # a folder without meta.json is incomplete (never renamed in by us); start over
        logger.warning("removing incomplete token cache %s", final)
        shutil.rmtree(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _build(corpus, cfg, tmp, final)
        os.rename(tmp, final)  # atomic on one filesystem: readers see no folder or a complete one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _build(corpus: _Corpus, cfg: DataConfig, out: Path, final: Path) -> None:
    """Train the tokenizer, encode the corpus and write tokenizer.json, train.bin, val.bin, meta.json into `out`
    (a temporary folder that becomes `final`)."""
    global _BUILD_COUNT
    started = time.perf_counter()
    logger.info("building token cache %s for %s (vocab %d)", final, corpus.label, cfg.vocab_size)

    counts = {"documents": 0, "chars": 0}

    def counted(docs: Iterable[str]) -> Iterator[str]:
        for doc in docs:
            if doc.strip():  # blank documents add nothing but an eot token
                counts["documents"] += 1
                counts["chars"] += len(doc)
                yield doc

    tokenizer = _train_tokenizer(counted(corpus.documents()), cfg.vocab_size)
    if counts["chars"] == 0:
        raise ValueError(f"empty corpus: data source {cfg.source!r} holds no text")
    tokenizer.save(str(out / "tokenizer.json"))
    eot_id = tokenizer.token_to_id(EOT_TOKEN)
    vocab_size = tokenizer.get_vocab_size()
    assert vocab_size <= np.iinfo(TOKEN_DTYPE).max + 1, vocab_size  # guaranteed by DataConfig.vocab_size

    n_tokens = _encode_stream(tokenizer, corpus.documents(), eot_id, out / "all.bin")
    if n_tokens < 2:
        raise ValueError(f"data source {cfg.source!r} encodes to {n_tokens} token(s); need at least 2 to split")
    # The last val_fraction of the stream (document order) is validation; at least one token each side.
    n_val = min(max(1, round(n_tokens * cfg.val_fraction)), n_tokens - 1)
    n_train = n_tokens - n_val
    _split_stream(out / "all.bin", n_train, out / "train.bin", out / "val.bin")

    elapsed = time.perf_counter() - started
    description = f"{corpus.label} ({_human(counts['chars'])} chars)"
    meta = {
        "format_version": FORMAT_VERSION,
        "source": cfg.source,
        "description": description,
        "identity": corpus.identity,
        "vocab_size_requested": cfg.vocab_size,
        "vocab_size": vocab_size,
        "eot_id": eot_id,
        "eot_token": EOT_TOKEN,
        "dtype": TOKEN_DTYPE.str,
        "val_fraction": cfg.val_fraction,
        "documents": counts["documents"],
        "chars": counts["chars"],
        "tokens": n_tokens,
        "train_tokens": n_train,
        "val_tokens": n_val,
        "build_seconds": round(elapsed, 3),
        "build_id": uuid.uuid4().hex,  # tells builds apart (a rebuilt cache gets a new id)
        "built_by_pid": os.getpid(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    _BUILD_COUNT += 1
    logger.info(
        "built token cache %s: %d documents, %s chars -> %d train + %d val tokens (vocab %d) in %.1f s",
        final.name,
        counts["documents"],
        _human(counts["chars"]),
        n_train,
        n_val,
        vocab_size,
        elapsed,
    )


def _train_tokenizer(documents: Iterator[str], vocab_size: int) -> tokenizers.Tokenizer:
    """Byte-level BPE as in GPT-2 (every byte is a base token, so any text encodes), plus EOT_TOKEN."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,  # an upper bound: a small corpus may run out of merges earlier
        min_frequency=2,  # a merge seen once is noise
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, even unseen ones
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def _encode_stream(tokenizer: tokenizers.Tokenizer, documents: Iterator[str], eot_id: int, path: Path) -> int:
    """Encode documents into `path` as uint16, eot_id between consecutive documents; returns the token count."""
    # Literal "<|endoftext|>" inside a document is text, not a boundary: only we place eot_id.
    tokenizer.encode_special_tokens = True
    n_tokens = 0
    first = True
    with path.open("wb") as f:
        chunk: list[str] = []
        for doc in documents:
            if doc.strip():
                chunk.append(doc)
            if len(chunk) == _ENCODE_CHUNK:
                n_tokens += _write_chunk(tokenizer, chunk, eot_id, f, first)
                first, chunk = False, []
        if chunk:
            n_tokens += _write_chunk(tokenizer, chunk, eot_id, f, first)
    return n_tokens


def _write_chunk(tokenizer: tokenizers.Tokenizer, chunk: list[str], eot_id: int, f: BinaryIO, first: bool) -> int:
    pieces: list[np.ndarray] = []
    eot = np.array([eot_id], dtype=TOKEN_DTYPE)
    for i, enc in enumerate(tokenizer.encode_batch(chunk, add_special_tokens=False)):
        if not (first and i == 0):
            pieces.append(eot)
        pieces.append(np.asarray(enc.ids, dtype=TOKEN_DTYPE))
    block = np.concatenate(pieces)
    f.write(block.tobytes())
    return int(block.size)


def _split_stream(all_path: Path, n_train: int, train_path: Path, val_path: Path) -> None:
    """all.bin -> train.bin (its first n_train tokens, by truncation: no copy) + val.bin (the rest, copied)."""
    with all_path.open("rb") as src, val_path.open("wb") as dst:
        src.seek(n_train * _TOKEN_BYTES)
        shutil.copyfileobj(src, dst)
    os.truncate(all_path, n_train * _TOKEN_BYTES)
    os.rename(all_path, train_path)


def _load(folder: Path) -> TokenData:
    meta = json.loads((folder / "meta.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        expected = int(meta[f"{split}_tokens"])
        size = path.stat().st_size if path.exists() else -1
        if size != expected * _TOKEN_BYTES:
            raise RuntimeError(
                f"token cache {folder} is corrupt: {path.name} has {size} bytes, meta.json says "
                f"{expected} tokens; delete the folder to rebuild it"
            )
        arrays[split] = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", shape=(expected,))
    return TokenData(
        train=arrays["train"],
        val=arrays["val"],
        vocab_size=int(meta["vocab_size"]),
        eot_id=int(meta["eot_id"]),
        cache_path=folder,
        description=str(meta["description"]),
    )


def _human(n: int) -> str:
    """12 -> '12', 12345 -> '12.3k', 2345678 -> '2.3M'."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return str(n)
