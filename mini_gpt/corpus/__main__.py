"""Prepare a corpus without training: `python -m mini_gpt.corpus prepare [data=... key=value ...]`.

    python -m mini_gpt.corpus prepare data=fineweb_edu data.max_tokens=100000000   # e.g. on a login node
    python -m mini_gpt.corpus prepare data=hf data.dataset='/corpora/owt/*.parquet' data.num_proc=32
    python -m mini_gpt.corpus prepare experiment=gpt2_124m_fineweb                # the data of a recipe
    python -m mini_gpt.corpus prepare data=shards data.path='fineweb10B/*.bin'      # check shards' headers

The overrides are train.py's (the same config is composed), so the training run that follows with the same
`data=...` finds the prepared files and starts at once. Prints one line: where the files are, and counts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mini_gpt.corpus.config import AnyDataConfig, HFDataConfig, ShardsDataConfig, data_config
from mini_gpt.errors import MiniGPTError, exit_on_user_error

USAGE = "usage: python -m mini_gpt.corpus prepare [data=NAME] [data.KEY=VALUE ...] (train.py's overrides)"


def prepare(cfg: AnyDataConfig, progress: bool | None = None) -> str:
    """Prepare (or find and check) the token files of any `data=` config; returns a one-line summary."""
    if isinstance(cfg, HFDataConfig | ShardsDataConfig):
        from mini_gpt.corpus.sharding import find_shards, prepare_shards

        c = prepare_shards(cfg, progress=progress) if isinstance(cfg, HFDataConfig) else find_shards(cfg)
        return (
            f"ready: {c.dir}: {c.train_tokens:,} train tokens in {len(c.train)} shard(s), "
            f"{c.val_tokens:,} val tokens in {len(c.val)} ({c.dtype}, {c.tokenizer!r})"
        )
    from mini_gpt.data import prepare_data

    p = prepare_data(cfg, progress=progress)
    return (
        f"ready: {p.dir}: {p.train_tokens:,} train tokens, {p.val_tokens:,} val tokens "
        f"({p.dtype}, {p.tokenizer!r})"
    )


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0 if args else 2
    if args[0] != "prepare":
        raise MiniGPTError(f"unknown command {args[0]!r}; {USAGE}")
    from mini_gpt.conf import compose

    try:
        cfg = compose(args[1:])
    except Exception as err:  # Hydra: an unknown group option or key
        raise MiniGPTError(f"bad overrides {' '.join(args[1:])}: {str(err).splitlines()[0]}") from None
    from omegaconf import OmegaConf

    print(prepare(data_config(OmegaConf.to_container(cfg.data, resolve=True))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
