"""What a trained model does inside (docs/inspect.md): the logit lens, head roles, ablations and activation
patching, all through forward hooks held for one analysis (`hooks`): the model carries no capture code."""
