"""Drop-in scorers for the tools ColBERT and ColPali users already work in. Each submodule
imports its tool only when imported itself: ``cupy_maxsim.integrations.pylate``."""
