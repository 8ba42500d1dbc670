"""Training utilities that pretraining, SFT and the RL trainer share: shared-prefix packing and
the learning-rate schedule. It sits below pretrain/ and rl/ so neither imports the other."""
