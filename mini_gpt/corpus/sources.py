"""Where the documents of `data=hf` come from: a Hugging Face Hub dataset (streamed) or local files.

`open_source(cfg)` resolves `data.dataset` once (files, the `datasets` builder, a fingerprint, the number
of documents when it is cheap to know) and `iter_texts(source)` streams the text column in batches, in
a fixed order (local files sorted by path), without materialising the dataset in the HF cache.

* **Local files**: a path, a directory (every supported file below it) or a glob. Parquet, JSON lines
  (`.jsonl`, `.json`, `.ndjson`, optionally `.gz` / `.zst` / `.bz2` / `.xz` compressed), Arrow, CSV.
* **Hub names** (`HuggingFaceFW/fineweb-edu`) need the network. Offline (`HF_HUB_OFFLINE=1`,
  `HF_DATASETS_OFFLINE=1`, or no answer from the Hub within a few seconds) they fail at once with one
  line saying to pass local files instead.

`datasets` is imported only here, and only when a `data=hf` corpus is actually read: it is an optional
extra (`pip install -e '.[datasets]'`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mini_gpt.corpus.config import HFDataConfig
from mini_gpt.errors import MiniGPTError

__all__ = ["BUILDERS", "Source", "is_local", "iter_texts", "open_source"]

# file suffix -> `datasets` builder
BUILDERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".arrow": "arrow",
    ".csv": "csv",
}
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
SAVE_TO_DISK_METADATA = ("state.json", "dataset_info.json")  # beside the .arrow files of save_to_disk
HUB_TIMEOUT_S = 3.0  # to decide that the Hub is unreachable


@dataclass(frozen=True)
class Source:
    """A resolved `data.dataset`: what to stream, and how to recognise it again."""

    dataset: str
    subset: str | None
    split: str
    text_field: str
    builder: str | None  # datasets builder for local files; None for a hub name
    files: tuple[str, ...]  # local files in reading order; () for a hub name
    fingerprint: str  # changes when the data changes (local: names, sizes, first/last MiB)
    num_documents: int | None  # when known without reading the data (parquet metadata)

    @property
    def is_local(self) -> bool:
        return self.builder is not None

    def describe(self) -> str:
        if self.is_local:
            return f"{len(self.files)} local {self.builder} file(s) {self.dataset}"
        return f"{self.dataset}" + (f" ({self.subset})" if self.subset else "") + f" split {self.split}"


def _suffix_builder(path: str) -> str | None:
    name = path.lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    return BUILDERS.get(os.path.splitext(name)[1])


def is_local(dataset: str) -> bool:
    """A glob, an existing path, or a name ending in a supported file suffix is local; else a hub name."""
    expanded = os.path.expanduser(dataset)
    return (
        any(ch in dataset for ch in "*?[")
        or os.path.exists(expanded)
        or dataset.startswith((".", "/", "~"))
        or _suffix_builder(dataset) is not None
    )


def _local_files(dataset: str) -> tuple[str, list[str]]:
    raw = os.path.expanduser(dataset)
    if any(ch in raw for ch in "*?["):
        files = sorted(str(Path(p).resolve()) for p in glob.glob(raw, recursive=True) if Path(p).is_file())
        if not files:
            raise MiniGPTError(f"data.dataset={dataset} matches no files; fix the glob pattern")
    elif Path(raw).is_dir():
        files = sorted(
            str(p.resolve())
            for p in Path(raw).rglob("*")
            if p.is_file() and _suffix_builder(p.name) and p.name not in SAVE_TO_DISK_METADATA
        )
        if not files:
            kinds = ", ".join(BUILDERS)
            raise MiniGPTError(
                f"data.dataset={dataset} is a directory without data files ({kinds}); fix the path"
            )
    elif Path(raw).is_file():
        files = [str(Path(raw).resolve())]
    else:
        raise MiniGPTError(
            f"data.dataset={dataset} does not exist (looked for {Path(raw).resolve()}); fix the path"
        )
    builders = {_suffix_builder(f) for f in files}
    if None in builders:
        bad = next(f for f in files if _suffix_builder(f) is None)
        raise MiniGPTError(
            f"data.dataset={dataset}: {bad} is not a supported data file "
            f"({', '.join(BUILDERS)}, optionally {', '.join(COMPRESSIONS)}); narrow the glob"
        )
    if len(builders) > 1:
        raise MiniGPTError(
            f"data.dataset={dataset} mixes file types ({', '.join(sorted(b for b in builders if b))}); "
            "prepare one type at a time"
        )
    return builders.pop() or "", files


def _fingerprint_files(files: list[str]) -> str:
    """sha256 over each file's name, size and first and last MiB: cheap on terabytes, and it changes when
    a file is replaced, extended or cut."""
    digest = hashlib.sha256()
    for f in files:
        size = os.path.getsize(f)
        digest.update(f"{os.path.basename(f)}\0{size}\0".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), os.SEEK_END)
                digest.update(fh.read(1 << 20))
    return digest.hexdigest()


def _offline_reason(timeout: float = HUB_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be used right now, or None when it answers."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host} unreachable: {err.strerror or type(err).__name__}"
    return None


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise MiniGPTError(
            "data=hf needs the Hugging Face `datasets` library: pip install -e '.[datasets]'"
        ) from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _parquet_rows(files: list[str]) -> list[int] | None:
    """Rows per parquet file, from the footers (no data read)."""
    try:
        import pyarrow.parquet as pq

        return [pq.ParquetFile(f).metadata.num_rows for f in files]
    except Exception:  # a broken file fails later with the reader's own message
        return None


def _hub_revision(name: str) -> str | None:
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(name, timeout=10).sha
    except Exception:
        return None


def open_source(cfg: HFDataConfig) -> Source:
    """Resolve `cfg.dataset` (no documents are read yet). Offline hub names fail here, in seconds."""
    assert cfg.dataset is not None
    if is_local(cfg.dataset):
        builder, files = _local_files(cfg.dataset)
        rows = _parquet_rows(files) if builder == "parquet" else None
        if rows is not None:  # empty parquet files hold no documents (and trip the reader): skip them
            files = [f for f, n in zip(files, rows) if n > 0]
            if not files:
                raise MiniGPTError(f"data.dataset={cfg.dataset} holds no documents (0 rows); check the files")
        return Source(
            cfg.dataset,
            cfg.subset,
            cfg.split,
            cfg.text_field,
            builder,
            tuple(files),
            _fingerprint_files(files),
            rows,
        )
    reason = _offline_reason()
    if reason is not None:
        raise MiniGPTError(
            f"data.dataset={cfg.dataset} is a Hugging Face Hub name, but the Hub cannot be reached "
            f"({reason}); offline, download the dataset's files elsewhere and pass them: "
            "data.dataset='/path/to/*.parquet'"
        )
    revision = _hub_revision(cfg.dataset)
    key = f"{cfg.dataset}\0{cfg.subset}\0{cfg.split}\0{revision}"
    return Source(
        cfg.dataset,
        cfg.subset,
        cfg.split,
        cfg.text_field,
        None,
        (),
        hashlib.sha256(key.encode()).hexdigest(),
        None,
    )


def _load(source: Source) -> Any:
    datasets = _import_datasets()
    try:
        if source.is_local:
            # csv: an empty field is an empty document, not a missing value (pandas would say NaN)
            extra = {"keep_default_na": False} if source.builder == "csv" else {}
            return datasets.load_dataset(
                source.builder, data_files=list(source.files), split="train", streaming=True, **extra
            )
        return datasets.load_dataset(source.dataset, source.subset, split=source.split, streaming=True)
    except MiniGPTError:
        raise
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise MiniGPTError(f"cannot open data.dataset={source.dataset}: {first}") from None


def _missing_column(source: Source, columns: list[str]) -> MiniGPTError:
    return MiniGPTError(
        f"data.text_field={source.text_field!r} is not a column of {source.dataset} "
        f"(columns: {', '.join(columns) or 'none'}); set data.text_field to the column holding the text"
    )


def iter_texts(source: Source, skip: int = 0, batch_size: int = 1000) -> Iterator[list[Any]]:
    """Batches of the text column's values (not yet checked to be strings), skipping the first `skip`
    documents. Errors of the underlying reader (a corrupt file, a bad row) become one-line MiniGPTErrors."""
    ds = _load(source)
    columns = list(ds.column_names) if ds.column_names is not None else None
    if columns is not None:
        if source.text_field not in columns:
            raise _missing_column(source, columns)
        ds = ds.select_columns([source.text_field])
    it = ds.iter(batch_size=batch_size)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except MiniGPTError:
            raise
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise MiniGPTError(f"cannot read {source.dataset}: {type(err).__name__}: {first}") from None
        if source.text_field not in batch:
            raise _missing_column(source, list(batch))
        texts = batch[source.text_field]
        if skip >= len(texts):
            skip -= len(texts)
            continue
        if skip:
            texts, skip = texts[skip:], 0
        yield texts
