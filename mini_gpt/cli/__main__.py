"""`python -m mini_gpt.cli <verb> ...` = `mini-gpt <verb> ...`."""

from mini_gpt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
