"""Alias of `mini-gpt prepare`: `python -m mini_gpt.data prepare data=...` keeps working."""

import sys

from mini_gpt.cli.prepare import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["prepare"] and not {"-h", "--help"} & set(sys.argv[1:2]):
        print("error: usage: python -m mini_gpt.data prepare [data=NAME] [key=value ...]", file=sys.stderr)
        raise SystemExit(2)
    main(sys.argv[2:] if sys.argv[1] == "prepare" else sys.argv[1:])
