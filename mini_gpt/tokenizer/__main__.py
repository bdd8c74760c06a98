"""Alias of `mini-gpt tokenizer`: `python -m mini_gpt.tokenizer train|eval key=value ...`."""

import sys

from mini_gpt.cli.tokenizer import main

if __name__ == "__main__":
    status = main(sys.argv[1:])
    raise SystemExit(status if isinstance(status, int) else 0)
