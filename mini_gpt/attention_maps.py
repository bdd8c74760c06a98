"""Alias of `mini-gpt attention-maps`: `python -m mini_gpt.attention_maps ...` keeps working."""

from mini_gpt.cli.attention_maps import main

if __name__ == "__main__":
    main()
