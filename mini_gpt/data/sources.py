"""Where text comes from: text corpora's files (`corpus_files`) and `data=hf` documents (`open_source`,
`iter_texts`). `datasets` and pyarrow (slow to import, optional) are imported only when read."""

from __future__ import annotations

import glob
import hashlib
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mini_gpt.data.config import CORPORA, TEXT_CORPUS, DataConfig, HFDataConfig
from mini_gpt.data.preparation import byte_progress
from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.files import atomic_write, sha256_file

DOWNLOAD_TIMEOUT_S = 15.0  # per socket operation; an offline machine fails in well under this
BUILDERS = {  # file suffix -> `datasets` builder
    ".parquet": "parquet", ".jsonl": "json", ".json": "json", ".ndjson": "json",
    ".arrow": "arrow", ".csv": "csv",
}  # fmt: skip
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
SAVE_TO_DISK_METADATA = ("state.json", "dataset_info.json")  # beside the .arrow files of save_to_disk
HUB_TIMEOUT_S = 3.0  # to decide that the Hub is unreachable


def _urlopen(url: str, timeout: float) -> Any:
    return urllib.request.urlopen(url, timeout=timeout)


def download(
    url: str, dest: Path, sha256: str | None, progress: bool | None = None,
    verify: Callable[[Path], None] | None = None,
) -> Path:  # fmt: skip
    """Download `url` to `dest` via a temporary file checked by `sha256` or `verify(file)`, then renamed."""
    digest = hashlib.sha256()
    with atomic_write(dest, "wb") as out, _urlopen(url, DOWNLOAD_TIMEOUT_S) as resp:
        total = int(resp.headers.get("Content-Length") or 0) if hasattr(resp, "headers") else 0
        with byte_progress(f"download {dest.name}", total, progress) as advance:
            while block := resp.read(1 << 16):
                out.write(block)
                digest.update(block)
                advance(len(block))
        if sha256 is not None and digest.hexdigest() != sha256:
            raise MiniGPTError(
                f"download of {url} has sha256 {digest.hexdigest()}, expected {sha256}; "
                f"retry, or put a verified copy at {dest}"
            )
        if verify is not None:
            out.flush()
            verify(Path(out.name))
    return dest


def glob_files(pattern: str) -> list[Path]:
    found = glob.glob(os.path.expanduser(pattern), recursive=True)
    return sorted(Path(p).resolve() for p in found if Path(p).is_file())


def find_files(value: str, key: str, in_dir: Callable[[Path], list[Path]], kinds: str) -> list[Path]:
    """The files `key=value` names: a glob's, one file, or a directory's `in_dir(directory)`."""
    raw = os.path.expanduser(value)
    path = Path(raw).resolve()
    if any(ch in raw for ch in "*?["):
        if files := glob_files(raw):
            return files
        raise MiniGPTError(f"{key}={value} matches no files; fix the glob pattern")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise MiniGPTError(f"{key}={value} does not exist (looked for {path}); fix the path")
    if files := in_dir(path):
        return files
    raise MiniGPTError(f"{key}={value} is a directory with no {kinds}; add some or fix the path")


def text_files(value: str, key: str) -> list[Path]:
    return find_files(value, key, lambda d: sorted(p for p in d.rglob("*.txt") if p.is_file()), ".txt files")


def corpus_files(cfg: DataConfig, progress: bool | None = None) -> list[Path]:
    """data=text's files, else the named corpus's verified file: data.path, the repository's copy,
    <data_dir>/<name>/ (or a corpus sharing the file), else downloaded there."""
    if cfg.name == TEXT_CORPUS:
        assert cfg.path is not None
        return text_files(cfg.path, "data.path")
    corpus = CORPORA[cfg.name]
    if cfg.path:
        path = Path(cfg.path).expanduser().resolve()
        if not path.is_file():
            raise MiniGPTError(f"data.path={cfg.path} does not exist (looked for {path}); fix the path")
        if (digest := sha256_file(path)) != corpus.sha256:
            raise MiniGPTError(
                f"data.path={path} has sha256 {digest}, not the {cfg.name} corpus ({corpus.sha256}); "
                f"for your own text use data=text data.path={path}"
            )
        return [path]
    if corpus.bundled is not None and corpus.bundled.is_file():
        if sha256_file(corpus.bundled) == corpus.sha256:
            return [corpus.bundled]
        warnings.warn(
            f"{corpus.bundled} does not match the {cfg.name} sha256 (edited?); restore it with "
            "`git checkout -- data/`; looking for another copy",
            stacklevel=3,
        )
    dest = cfg.root / cfg.name / corpus.filename
    sharing = [cfg.root / name / c.filename for name, c in CORPORA.items() if c.sha256 == corpus.sha256]
    for path in [dest, *(p for p in sharing if p != dest)]:
        if path.is_file():
            if sha256_file(path) == corpus.sha256:
                return [path]
            if path == dest:
                raise MiniGPTError(
                    f"{path} does not match the {cfg.name} sha256 {corpus.sha256}; delete it to download "
                    "again, or replace it with the right file"
                )
    try:
        return [download(corpus.url, dest, corpus.sha256, progress)]
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        raise MiniGPTError(
            f"cannot download {cfg.name} from {corpus.url} ({type(err).__name__}: {err}); offline, put the "
            f"file at {dest} (sha256 {corpus.sha256}) or set data.path=/path/to/{corpus.filename}"
        ) from None


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


def _suffix_builder(path: str) -> str | None:
    stem, ext = os.path.splitext(path.lower())
    if ext in COMPRESSIONS:
        ext = os.path.splitext(stem)[1]
    return BUILDERS.get(ext)


def is_local(dataset: str) -> bool:
    if any(ch in dataset for ch in "*?[") or dataset.startswith((".", "/", "~")):
        return True
    return os.path.exists(os.path.expanduser(dataset)) or _suffix_builder(dataset) is not None


def _data_files(directory: Path) -> list[Path]:
    """A directory's data files, recursively (not the JSON beside the .arrow files of save_to_disk)."""
    found = [p for p in directory.rglob("*") if p.is_file() and _suffix_builder(p.name)]
    return sorted((p.resolve() for p in found if p.name not in SAVE_TO_DISK_METADATA), key=str)


def _local_files(dataset: str) -> tuple[str, list[str]]:
    kinds = f"data files ({', '.join(BUILDERS)})"
    files = [str(f) for f in find_files(dataset, "data.dataset", _data_files, kinds)]
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
    """sha256 of each file's name, size and first and last MiB: cheap on terabytes."""
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


OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _switched_on(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline_reason(switches: tuple[str, ...] = OFFLINE_SWITCHES) -> str | None:
    """Why the Hugging Face Hub cannot be used now (an offline switch, no answer), or None."""
    if on := [var for var in switches if _switched_on(var)]:
        return f"{on[0]} is set"
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_TIMEOUT_S).close()
    except OSError as err:
        return f"{host}:{port} does not answer: {err.strerror or type(err).__name__}"
    return None


def offline_if_hub_unreachable() -> str | None:
    """Why the Hub cannot be reached, having switched the Hugging Face libraries offline (else `datasets`
    retries each file for ~40 s); None when it answers or a switch is on. Call it before they are imported."""
    reason = None if any(map(_switched_on, OFFLINE_SWITCHES)) else hub_offline_reason(switches=())
    if reason is not None:
        os.environ.update(dict.fromkeys(OFFLINE_SWITCHES, "1"))
    return reason


def _import_datasets() -> Any:
    missing = 'data=hf needs the Hugging Face `datasets` library: pip install -e ".[datasets]"'
    datasets = import_extra("datasets", missing)
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _parquet_rows(files: list[str]) -> list[int] | None:
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
    """Resolve `cfg.dataset` without reading documents; offline hub names fail here, in seconds."""
    assert cfg.dataset is not None
    named = (cfg.dataset, cfg.subset, cfg.split, cfg.text_field)  # the Source's first four fields
    if is_local(cfg.dataset):
        builder, files = _local_files(cfg.dataset)
        rows = _parquet_rows(files) if builder == "parquet" else None
        if rows is not None:  # empty parquet files hold no documents (and trip the reader): skip them
            files = [f for f, n in zip(files, rows) if n > 0]
            if not files:
                raise MiniGPTError(f"data.dataset={cfg.dataset} holds no documents (0 rows); check the files")
        n_docs = sum(rows) if rows is not None else None
        return Source(*named, builder, tuple(files), _fingerprint_files(files), num_documents=n_docs)
    reason = hub_offline_reason()
    if reason is not None:
        raise MiniGPTError(
            f"data.dataset={cfg.dataset} is a Hugging Face Hub name, but the Hub cannot be reached "
            f"({reason}); offline, download the dataset's files elsewhere and pass them: "
            "data.dataset='/path/to/*.parquet'"
        )
    revision = _hub_revision(cfg.dataset)
    key = f"{cfg.dataset}\0{cfg.subset}\0{cfg.split}\0{revision}"
    return Source(*named, None, (), hashlib.sha256(key.encode()).hexdigest(), num_documents=None)


def _missing_column(source: Source, columns: list[str]) -> MiniGPTError:
    return MiniGPTError(
        f"data.text_field={source.text_field!r} is not a column of {source.dataset} "
        f"(columns: {', '.join(columns) or 'none'}); set data.text_field to the column holding the text"
    )


def _parquet_batches(source: Source, batch_size: int) -> Iterator[list[Any]]:
    """Local parquet's text column by pyarrow, unbuffered (`datasets`' memory grows with the file)."""
    missing = 'reading parquet files needs pyarrow: pip install -e ".[datasets]" (or pip install pyarrow)'
    pq = import_extra("pyarrow.parquet", missing)
    for path in source.files:
        file = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        if source.text_field not in file.schema_arrow.names:
            raise _missing_column(source, file.schema_arrow.names)
        for batch in file.iter_batches(batch_size=batch_size, columns=[source.text_field]):
            yield batch.column(0).to_pylist()


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def _dataset_batches(source: Source, batch_size: int) -> Iterator[list[Any]]:
    datasets = _import_datasets()
    try:
        if source.builder is None:
            ds = datasets.load_dataset(source.dataset, source.subset, split=source.split, streaming=True)
        else:  # csv: an empty field is an empty document, not a missing value (pandas would say NaN)
            kw = {"keep_default_na": False} if source.builder == "csv" else {}
            files = list(source.files)
            ds = datasets.load_dataset(source.builder, data_files=files, split="train", streaming=True, **kw)
    except Exception as err:
        raise MiniGPTError(f"cannot open data.dataset={source.dataset}: {_first_line(err)}") from None
    if ds.column_names is not None:
        if source.text_field not in ds.column_names:
            raise _missing_column(source, list(ds.column_names))
        ds = ds.select_columns([source.text_field])
    for batch in ds.iter(batch_size=batch_size):
        if source.text_field not in batch:
            raise _missing_column(source, list(batch))
        yield batch[source.text_field]


def iter_texts(source: Source, skip: int = 0, batch_size: int = 1000) -> Iterator[list[Any]]:
    """Batches of the text column's values (not checked to be strings) after the first `skip` documents."""
    read = _parquet_batches if source.builder == "parquet" else _dataset_batches
    try:
        for texts in read(source, batch_size):
            texts, skip = texts[skip:], max(0, skip - len(texts))
            if texts:
                yield texts
    except MiniGPTError:
        raise
    except Exception as err:
        what = f"{type(err).__name__}: {_first_line(err)}"
        raise MiniGPTError(f"cannot read {source.dataset}: {what}") from None
