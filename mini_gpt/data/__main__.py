"""Prepare a corpus without training: `python -m mini_gpt.data prepare [data=... key=value ...]`.

    python -m mini_gpt.data prepare data=fineweb_edu data.max_tokens=100000000   # e.g. on a login node
    python -m mini_gpt.data prepare data=hf data.dataset='/corpora/owt/*.parquet' data.num_proc=32
    python -m mini_gpt.data prepare experiment=gpt2_124m_fineweb                # the data of a recipe
    python -m mini_gpt.data prepare data=shards data.path='fineweb10B/*.bin'      # check shards' headers

The overrides are train.py's (the same config is composed), so the training run that follows with the same
`data=...` finds the prepared files and starts at once. Prints one line: where the files are, and counts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mini_gpt.data import AnyDataConfig, ShardedCorpus, data_config, prepare
from mini_gpt.errors import MiniGPTError, exit_on_user_error

USAGE = "usage: python -m mini_gpt.data prepare [data=NAME] [data.KEY=VALUE ...] (train.py's overrides)"


def summary(cfg: AnyDataConfig, progress: bool | None = None) -> str:
    """Prepare (or find and check) the token files of any `data=` config; returns a one-line summary."""
    c = prepare(cfg, progress=progress)
    train, val = (
        (f" in {len(c.train)} shard(s)", f" in {len(c.val)}") if isinstance(c, ShardedCorpus) else ("", "")
    )
    return (
        f"ready: {c.dir}: {c.train_tokens:,} train tokens{train}, {c.val_tokens:,} val tokens{val} "
        f"({c.dtype}, {c.tokenizer!r})"
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

    print(summary(data_config(OmegaConf.to_container(cfg.data, resolve=True))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
