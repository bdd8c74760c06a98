"""Alias of `mini-gpt export`: `python -m mini_gpt.export ...` keeps working."""

from mini_gpt.cli.export import main

if __name__ == "__main__":
    main()
