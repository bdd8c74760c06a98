"""Alias of `mini-gpt generate`: `python -m mini_gpt.generate ...` keeps working."""

from mini_gpt.cli.generate import main

if __name__ == "__main__":
    main()
