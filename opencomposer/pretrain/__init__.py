"""Continued pretraining: code corpus (data.py), the MTP + context-extension trainer (train.py),
checkpoints (checkpoint.py), the run config (config.py) and `opencomposer pretrain` (cli.py)."""
