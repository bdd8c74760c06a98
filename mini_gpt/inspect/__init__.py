"""What a trained model does inside: the logit lens, head roles, ablations and activation patching.

Every analysis reads or changes activations through PyTorch forward hooks on the GPT's own modules
(`mini_gpt.inspect.hooks`), registered for one analysis and removed after it: the model carries no
capture code, so training and generation pay nothing for it.
"""
