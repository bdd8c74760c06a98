"""Training: the run (train(cfg)), the LightningModule, optimizers, callbacks, fine-tuning, resume, sweeps."""
