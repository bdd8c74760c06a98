"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra; configs in conf/).

    python train.py                                   # the default char model on tiny Shakespeare
    python train.py model=baby trainer.max_steps=2000 optim.lr=1e-3 data=shakespeare logger=csv
    python train.py experiment=shakespeare_char_gpu
    python train.py ckpt_path=outputs/train/runs/<date>/<time>/checkpoints/last.ckpt   # resume exactly

The same command as `mini-gpt train ...`; the Hydra app is mini_gpt.cli.train.
"""

from mini_gpt.cli.train import main

if __name__ == "__main__":
    main()
