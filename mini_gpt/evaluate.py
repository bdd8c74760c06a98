"""Alias of `mini-gpt evaluate`: `python -m mini_gpt.evaluate ...` keeps working."""

from mini_gpt.cli.evaluate import main

if __name__ == "__main__":
    main()
