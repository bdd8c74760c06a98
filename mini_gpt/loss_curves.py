"""Alias of `mini-gpt plot`: `python -m mini_gpt.loss_curves RUN_DIR ...` keeps working."""

from mini_gpt.cli.loss_curves import main

if __name__ == "__main__":
    main()
