"""Alias of `mini-gpt harness`: `python -m mini_gpt.harness ...` keeps working."""

from mini_gpt.cli.harness import main

if __name__ == "__main__":
    main()
